"""Giving held jobs back: fenced, in id order, and never lost when the statement fails."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import forklift
from forklift.admin.jobs import JobAdmin
from forklift.errors import DatabaseError
from forklift.store import ClaimedJob, JobStore
from forklift.testing import wait_for
from forklift.workers import Worker, WorkerConfig
from tests.integration.conftest import RunWorker

OWNER = "test-host:1:release"


def lock_waiters(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        " AND position(%s IN query) > 0 AND pid <> pg_backend_pid()",
        (schema,),
    ).fetchone()
    return int(row[0]) if row else 0


def claimed_highest_first(app: forklift.App, store: JobStore, n: int) -> list[ClaimedJob]:
    """n jobs claimed one at a time, the highest id first: the order a worker that
    claims as it goes holds them in (and the order of their rows in the owner's index)."""
    ids = [app.enqueue("noop", priority=i) for i in range(n)]  # the last: most urgent
    jobs = [store.job_claim(["default"], OWNER, 1, 30.0, expired=False)[0] for _ in ids]
    assert [j.id for j in jobs] == sorted(ids, reverse=True)
    return jobs


def starter(errors: list[BaseException]) -> Callable[..., threading.Thread]:
    """Start fn(*args) on a thread; what it raises goes to `errors`."""

    def run(fn: Callable[..., object], *args: Any) -> threading.Thread:
        def target() -> None:
            try:
                fn(*args)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    return run


def test_release_and_a_multi_job_cancel_never_deadlock(
    app: forklift.App, store: JobStore, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    admin = JobAdmin(dsn, schema)
    for _ in range(5):
        jobs = claimed_highest_first(app, store, 3)
        errors: list[BaseException] = []
        run = starter(errors)
        # A third session holds the middle row, so both statements start, take what
        # they can in their own order and queue up behind it; then it lets go.
        with psycopg.connect(dsn) as blocker:
            middle = sorted(j.id for j in jobs)[1]
            blocker.execute(f"SELECT 1 FROM {schema}.jobs WHERE id = %s FOR UPDATE", (middle,))
            release = run(store.job_release_many, [(j.id, j.attempt) for j in jobs], OWNER)
            cancel = run(admin.job_cancel_many, [j.id for j in jobs])
            wait_for(lambda: lock_waiters(db, schema) == 2, what="both waiting on the row")
        release.join(timeout=30)
        cancel.join(timeout=30)
        assert errors == []
        states = db.execute(
            f"SELECT DISTINCT state::text FROM {schema}.jobs WHERE id = ANY(%s)",
            ([j.id for j in jobs],),
        ).fetchall()
        assert states == [("cancelled",)]  # released first, or not, the cancel wins


def test_release_errors_are_database_errors(store: JobStore) -> None:
    store.pool.close()
    with pytest.raises(DatabaseError, match=r"^release failed: "):
        store.job_release_many([(1, 1)], OWNER)


def fail_releases(db: psycopg.Connection[Any], schema: str, times: int) -> None:
    """Make the next `times` releases of a job fail in the database (a trigger raising;
    a sequence counts them, since a failed statement rolls back whatever else it wrote)."""
    db.execute(f"CREATE SEQUENCE {schema}.release_faults")
    db.execute(
        f"""CREATE FUNCTION {schema}.fail_release() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF nextval('{schema}.release_faults') <= {times} THEN
                RAISE EXCEPTION 'injected release failure';
            END IF;
            RETURN NEW;
        END $$"""
    )
    db.execute(
        f"CREATE TRIGGER fail_release BEFORE UPDATE ON {schema}.jobs FOR EACH ROW"
        " WHEN (OLD.state = 'running' AND NEW.state = 'ready'"
        " AND NEW.attempts = OLD.attempts - 1)"
        f" EXECUTE FUNCTION {schema}.fail_release()"
    )


def failed_releases(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute(f"SELECT last_value, is_called FROM {schema}.release_faults").fetchone()
    assert row is not None
    return int(row[0]) if row[1] else 0


def rows(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> set[tuple[Any, ...]]:
    """(state, attempts, lease owner, claimed at least once) of the jobs."""
    return set(
        db.execute(
            "SELECT state::text, attempts, lease_owner, started_at IS NOT NULL"
            f" FROM {schema}.jobs WHERE id = ANY(%s)",
            (ids,),
        ).fetchall()
    )


def test_a_failed_release_at_stop_is_tried_again_and_costs_no_attempt(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    started: list[int] = []
    worker = Worker(
        app,
        WorkerConfig(grace=0.0, lease=3.0, maintenance=False),
        on_job_start=lambda job: started.append(job.id),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    job_id = app.enqueue("sleep", {"seconds": 30})
    wait_for(lambda: started == [job_id], what="job started")
    fail_releases(db, schema, times=2)
    worker.request_stop()
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert rows(db, schema, [job_id]) == {("ready", 0, None, True)}
    assert failed_releases(db, schema) == 3  # two failed, the third went through


def test_a_failed_release_keeps_the_jobs_held_and_tries_again(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    worker = run_worker()
    warm = app.enqueue_many([("noop", {}) for _ in range(100)])
    wait_for(lambda: rows(db, schema, warm) == {("succeeded", 1, None, True)}, what="warmed")
    assert worker.prefetch.ahead() > 10  # it claims ahead now
    fail_releases(db, schema, times=1)
    _long, *short = app.enqueue_many(
        [("sleep", {"seconds": 30.0})] + [("noop", {}) for _ in range(20)]
    )
    # The first release fails; the jobs stay this worker's (their leases renewed),
    # and the next one gives them back, the attempt not counted.
    given_back = {("ready", 0, None, True)}
    wait_for(lambda: rows(db, schema, short) == given_back, timeout=5, what="released")
    assert failed_releases(db, schema) >= 2
    assert worker.holdings.waiting() == 0 and len(worker.holdings) == 1
