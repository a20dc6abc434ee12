"""An idle worker's lookups: once per wake, about jobs its claim could take."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import forklift
from forklift.store import JobStore
from tests.integration.conftest import RunWorker

OWNER = "host:1:w"


def held_back(db: psycopg.Connection[Any], schema: str, n: int, queue: str = "default") -> None:
    """`n` due jobs under a limit's key, of a task the test app does not declare: a plain
    claim never takes them (a worker whose app declares the limit does)."""
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task, limit_key)"
        " SELECT %s, 'declared_elsewhere', 'k' FROM generate_series(1, %s)",
        (queue, n),
    )


def test_an_idle_worker_looks_once_per_wake_past_jobs_it_cannot_take(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """Its queue holds jobs under a limit its app does not declare: the lookup after an
    empty claim answered "due now" for them, and the worker claimed and looked again
    without pause (1,209 claims and as many lookups in 3 s)."""
    held_back(db, schema, 100)
    worker = run_worker(poll_interval=0.5)
    calls = {"claims": 0, "lookups": 0}
    claim, lookup = worker.claimer.claim, worker.store.job_next_available

    def counted_claim(*args: Any, **kwargs: Any) -> Any:
        calls["claims"] += 1
        return claim(*args, **kwargs)

    def counted_lookup(*args: Any, **kwargs: Any) -> Any:
        calls["lookups"] += 1
        return lookup(*args, **kwargs)

    worker.claimer.claim = counted_claim  # type: ignore[method-assign]
    worker.store.job_next_available = counted_lookup  # type: ignore[method-assign]
    worker.idle.wait()
    window = 2.0
    began = time.monotonic()
    start = dict(calls)
    while time.monotonic() - began < window:  # a spin shows within any window
        time.sleep(0.1)
    claims, lookups = (calls[k] - start[k] for k in ("claims", "lookups"))
    wakes = window / 0.5 + 2  # the poll interval's, and one either side of the window
    assert claims <= wakes and lookups <= claims + 1, (claims, lookups)


def test_the_next_due_lookups_count_only_jobs_the_claim_could_take_due_after_it(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, store: JobStore
) -> None:
    # Due jobs it did not take (held back under a limit, or another claim's) are not
    # "due now"; a delayed job is, once due; one that fell due between the claim and the
    # lookup (`since`) counts as due now, not missed.
    held_back(db, schema, 5)
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task, limit_key, available_at)"
        " VALUES ('default', 'declared_elsewhere', 'k', now() + interval '100 seconds')"
    )
    assert store.job_next_available(["default"]) is None
    app.enqueue("noop", delay=600)
    app.enqueue_many([("noop", {}) for _ in range(2)])
    made = store.job_claim_next((), ["default"], OWNER, 5, 30.0, expired=False)
    assert len(made.jobs) == 2 and made.next_due is not None
    assert made.next_due[0] == pytest.approx(600, abs=60)
    assert store.job_next_available(["default"]) == pytest.approx(600, abs=60)
    just = app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET available_at = now() - interval '0.5 seconds' WHERE id = %s",
        (just,),
    )
    assert store.job_next_available(["default"], since=0.0) == pytest.approx(600, abs=60)
    assert store.job_next_available(["default"], since=5.0) == 0.0
    db.execute(f"INSERT INTO {schema}.paused_queues (queue, paused_by) VALUES ('default', 't')")
    assert store.job_next_available(["default"], since=5.0) is None
