"""Giving held jobs back: fenced, in id order, and never lost when the statement fails."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.admin.jobs import JobAdmin
from forklift.errors import DatabaseError
from forklift.store import ClaimedJob, JobStore
from forklift.testing import wait_for

OWNER = "test-host:1:release"


@pytest.fixture
def store(dsn: str, schema: str) -> Iterator[JobStore]:
    pool = _db.make_pool(dsn, _db.Timeouts(), max_size=2, name="test-release")
    pool.open(wait=True, timeout=10)
    yield JobStore(pool, schema)
    pool.close()


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
