"""Async handlers under the real supervisor: a handler that blocks the event loop, and an
async job's timeout (the loop's cancel, and the supervisor's kill as the backstop)."""

from __future__ import annotations

import re
from typing import Any

import psycopg

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import scalar, wait_state

APP = "tests.apps.asyncio_jobs:app"


def job(db: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any]:
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    found = cur.execute(f"SELECT * FROM {schema}.jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return found


def test_a_handler_that_blocks_the_loop_delays_async_timers_and_charges_nothing(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """A 5 s time.sleep in an async handler, with a 3 s lease: the other async job's
    timers wait for it, the sync job beside runs on, every lease is renewed meanwhile
    (renewals are a thread of their own), and nothing is charged or run twice."""
    app = forklift.App(dsn, schema=schema)
    sup = forklift_cli("run", APP, "--workers", "1", "--concurrency", "10", "--lease", "3s")
    ticking = app.enqueue("tick", {"every": 0.2, "until_gap": 4.0, "most": 300})
    sync = app.enqueue("nap_sync", {"seconds": 6.0})
    wait_state(db, schema, ticking, "running", timeout=20)
    wait_state(db, schema, sync, "running")
    blocker = app.enqueue("block", {"seconds": 5.0})
    wait_state(db, schema, blocker, "running")
    leased = scalar(db, f"SELECT lease_until FROM {schema}.jobs WHERE id = %s", ticking)
    wait_for(
        lambda: scalar(db, f"SELECT lease_until FROM {schema}.jobs WHERE id = %s", ticking)
        > leased,
        timeout=4, what="a renewal while the loop is blocked",
    )  # fmt: skip
    assert job(db, schema, blocker)["state"] == "running"  # the renewal came mid-block
    for job_id in (ticking, sync, blocker):
        wait_state(db, schema, job_id, "succeeded", timeout=20)
        row = job(db, schema, job_id)
        assert (row["attempts"], row["crashes"], row["errors"]) == (1, 0, []), row
    gap = job(db, schema, ticking)["result"]["max_gap"]
    print(f"\nthe ticking job's longest gap between 0.2 s timers: {gap} s")
    assert gap >= 4.0  # its timers waited for the blocking call to return
    log = sup.output()
    assert re.search(rf"worker\.loop_blocked .*job=block#{blocker}", log), log[-3000:]
    unblocked = re.search(r"worker\.loop_unblocked .*blocked_for=([\d.]+)", log)
    assert unblocked and float(unblocked[1]) >= 4.0, log[-3000:]
    print(f"logged: {unblocked[0]}")
    for word in ("lease_lost", "LeaseExpired", "child.killing", "WorkerLost"):
        assert word not in log, log[-3000:]
    app.close()


def test_an_async_timeout_is_the_loops_cancel_and_the_supervisors_kill_the_backstop(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)  # a producer that does not know the tasks
    args = ("--workers", "1", "--concurrency", "10", "--kill-grace", "1")
    sup = forklift_cli("run", APP, *args)
    # Awaiting past 1 s: the loop cancels it; the bystander in the same process runs on.
    bystander = app.enqueue("bystander", {"seconds": 2.5})
    wait_state(db, schema, bystander, "running", timeout=20)
    owner = job(db, schema, bystander)["lease_owner"]
    awaiting = app.enqueue("late", {"blocking": False}, max_attempts=1)
    wait_state(db, schema, awaiting, "dead")
    row = job(db, schema, awaiting)
    assert row["last_error"] == f"TimeoutError: job late#{awaiting} timed out after 1 s"
    assert (row["attempts"], row["crashes"]) == (1, 0)
    wait_state(db, schema, bystander, "succeeded")
    assert job(db, schema, bystander)["attempts"] == 1
    assert "child.killing" not in sup.output()
    # Blocking the loop past 1 s: nothing in the process can cancel it; the supervisor
    # kills the process at the timeout and the grace of an async job (boot.py), charges
    # it a TimeoutError in the same words, and gives the bystander back uncharged.
    bystander = app.enqueue("bystander", {"seconds": 4.0})
    wait_state(db, schema, bystander, "running")
    blocking = app.enqueue("late", {"blocking": True}, max_attempts=1)
    wait_state(db, schema, blocking, "dead", timeout=15)
    row = job(db, schema, blocking)
    assert row["last_error"] == f"TimeoutError: job late#{blocking} timed out after 1 s"
    assert (row["attempts"], row["crashes"]) == (1, 0)
    assert "child.killing" in sup.output()
    wait_state(db, schema, bystander, "succeeded", timeout=30)
    row = job(db, schema, bystander)
    assert (row["attempts"], row["crashes"], row["errors"]) == (1, 0, []), row
    assert row["lease_owner"] is None and owner != ""
    app.close()
