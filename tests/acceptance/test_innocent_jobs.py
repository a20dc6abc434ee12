"""A fault is charged to the job at fault: a worker's death charges the jobs whose
handlers were running, never the ones it had claimed ahead or whose handlers returned;
a timeout frees a limit's slot only once the handler has stopped; a native crash leaves
its stack on the job; a dead worker's subprocesses go with it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import process_state, wait_for
from tests.acceptance.conftest import scalar, wait_state

APP = "tests.apps.innocent:app"


def finished(db: psycopg.Connection[Any], schema: str) -> bool:
    left = scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state IN ('ready', 'running')")
    return bool(left == 0)


def test_a_crashing_job_among_300_charges_no_innocent_job(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """Before: 255 of the 300 no-op jobs ended dead ("Quarantined: crashed its worker 2
    times"): every job the worker held when the poison killed it, claimed ahead or done
    and waiting for its group commit, was charged a crash."""
    app = forklift.App(dsn, schema=schema)
    first = app.enqueue_many([("noop", {})] * 150)
    poison = app.enqueue("exit", {"code": 7})
    rest = app.enqueue_many([("noop", {})] * 150)
    sup = forklift_cli("run", APP, "--workers", "1")
    wait_for(lambda: finished(db, schema), timeout=60, what="every job finished")
    innocent = first + rest
    rows = db.execute(
        f"SELECT state, crashes, count(*) FROM {schema}.jobs WHERE id = ANY(%s)"
        " GROUP BY state, crashes",
        (innocent,),
    ).fetchall()
    assert rows == [("succeeded", 0, 300)], rows
    state, crashes = db.execute(
        f"SELECT state, crashes FROM {schema}.jobs WHERE id = %s", (poison,)
    ).fetchone() or (None, None)
    assert (state, crashes) == ("dead", 2)
    sup.stop_cleanly(timeout=15)
    app.close()


@pytest.mark.parametrize("grace", ["30", "0.5"])
def test_a_timeout_frees_its_limit_slot_only_once_its_handler_stopped(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    forklift_cli: Any,
    tmp_path: Path,
    grace: str,
) -> None:
    """Before: the overdue job was charged (ready again, its slot free) at once and its
    child killed `--kill-grace` later, so its key's next job, or its own next attempt,
    ran beside the handler still spinning. With a grace shorter than the kill's, the
    child, stopping, must not give the overdue job back either."""
    marks = tmp_path / "marks"
    app = forklift.App(dsn, schema=schema)
    args = {"key": "a", "marks": str(marks), "spin": 30.0}
    ids = [app.enqueue("overrun", args) for _ in range(3)]
    sup = forklift_cli("run", APP, "--workers", "2", "--kill-grace", "3", "--grace", grace)
    wait_for(lambda: finished(db, schema), timeout=90, what="every job finished")
    starts = [line.split() for line in marks.read_text().splitlines() if line.startswith("start")]
    assert len(starts) == 6, starts  # 3 jobs, 2 attempts each
    assert [s[3] for s in starts] == ["0"] * 6, starts
    errors = db.execute(
        f"SELECT state, crashes, last_error FROM {schema}.jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    for state, crashes, _ in errors:  # the second attempt returns at once
        assert state == "succeeded" and crashes == 0, errors
    timed_out = scalar(
        db,
        f"SELECT count(*) FROM {schema}.jobs, jsonb_array_elements(errors) AS e"
        " WHERE id = ANY(%s) AND e->>'error' LIKE '%%timed out after 1 s%%'",
        ids,
    )
    assert timed_out == 3
    sup.stop_cleanly(timeout=15)
    app.close()


def test_a_segfault_leaves_its_stack_on_the_job_and_its_retry_waits(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """Before: "killed by SIGSEGV" and nothing more, and the retry ran at once (both
    workers of a host dead within 52 ms)."""
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("segfault")
    sup = forklift_cli("run", APP, "--workers", "2")
    wait_state(db, schema, job_id, "dead", timeout=30)
    errors = scalar(db, f"SELECT errors FROM {schema}.jobs WHERE id = %s", job_id)
    assert len(errors) == 2, errors
    first = errors[0]["error"]
    assert "SIGSEGV" in first and "Fatal Python error: Segmentation fault" in first, first
    assert "in segfault" in first, first  # the handler's own frame
    assert len(first) < 4000
    gap = scalar(
        db,
        "SELECT extract(epoch FROM (e->>'at')::timestamptz - (f->>'at')::timestamptz)"
        f" FROM {schema}.jobs, LATERAL (SELECT errors->0 AS f, errors->1 AS e) AS x"
        " WHERE id = %s",
        job_id,
    )
    assert gap >= 0.5, gap  # its retry waited out a backoff
    sup.stop_cleanly(timeout=15)
    app.close()


def test_a_dead_workers_subprocesses_die_with_it(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any, tmp_path: Path
) -> None:
    """Before: the handler's `sleep 600` was reparented to PID 1 and ran on, so a retry
    of its job could run its external work twice at once."""
    pidfile = tmp_path / "pid"
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("spawn_and_die", {"pidfile": str(pidfile)})
    sup = forklift_cli("run", APP, "--workers", "1")
    wait_state(db, schema, job_id, "dead", timeout=30)
    pid = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="pid"))

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return process_state(pid) in (None, "Z")  # a zombie of someone's: gone too

    try:
        wait_for(gone, timeout=5, what="the handler's subprocess killed")
    finally:
        if not gone():
            os.kill(pid, 9)
    sup.stop_cleanly(timeout=15)
    app.close()
