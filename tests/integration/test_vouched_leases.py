"""An expired lease whose owner is vouched for again (its liveness lock taken back since
the lease ran out: the worker is alive, cut off for longer than its lease by an outage)
is neither re-claimed nor dead-lettered; one whose lock is free, or held since before
(a frozen worker), is: lease expiry charges only an owner nobody vouches for. Every path
that takes an expired lease: the plain claim, both claims under limits, the rescue."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _locks
from forklift._ids import liveness_holder
from forklift.store.limits import LimitStore
from tests.integration.conftest import let_go

Db = psycopg.Connection[Any]

# A supervisor's child (its supervisor's lock vouches for it), and a worker on its own.
CHILD = "node-1.example.com:4101:aa11aa@4100.bb22bb"  # its key: the supervisor's
ALONE = "host-b:4200:cc33cc"
GONE = "host-c:4300:dd44dd@4301.ee55ee"  # nobody holds its supervisor's lock


@pytest.fixture
def app(dsn: str, schema: str) -> Iterator[forklift.App]:
    a = forklift.App(dsn, schema=schema)

    @a.task
    def plain(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    @a.task(limit=forklift.Limit(concurrency=5))
    def limited(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    yield a
    a.close()


@pytest.fixture
def vouch(dsn: str, schema: str) -> Iterator[Callable[[str], Db]]:
    """Holds the liveness lock that vouches for an owner, on a session of its own (as
    the owner's supervisor, or the owner itself, would); closing it lets go."""
    sessions: list[Db] = []

    def hold(owner: str) -> Db:
        conn = psycopg.connect(dsn, autocommit=True)
        sessions.append(conn)
        assert _locks.try_take(conn, _locks.liveness(schema, liveness_holder(owner)))
        return conn

    yield hold
    for conn in sessions:
        conn.close()


def expire(db: Db, schema: str, job_id: int, owner: str, *, attempts: int = 1) -> None:
    """Make `job_id` a job `owner` holds whose lease ran out a second ago, its handler
    seen running (a lost lease charges it an attempt: test_lost_leases.py)."""
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = %s, lease_owner = %s,"
        " seen_running = true, started_at = now() - interval '1 minute',"
        " lease_until = now() - interval '1 second'"
        " WHERE id = %s",
        (attempts, owner, job_id),
    )


def owners(db: Db, schema: str, ids: list[int]) -> dict[int, str]:
    rows = db.execute(
        f"SELECT id, lease_owner FROM {schema}.jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    return dict(rows)


def test_the_claim_takes_an_expired_lease_only_once_its_owner_is_vouched_for_by_no_one(
    app: forklift.App, db: Db, schema: str, vouch: Callable[[str], Db]
) -> None:
    child, alone, gone = app.enqueue_many([("plain", {"n": i}) for i in range(3)])
    for job_id, owner in ((child, CHILD), (alone, ALONE), (gone, GONE)):
        expire(db, schema, job_id, owner)
    supervisor = vouch(CHILD)
    vouch(ALONE)
    taken = app.store.job_claim(["default"], "peer:1:ff", 10, 30.0, expired=True)
    assert [j.id for j in taken] == [gone]
    assert owners(db, schema, [child, alone]) == {child: CHILD, alone: ALONE}
    # The child's supervisor is gone: now the child's job is lost.
    let_go(supervisor, db, _locks.liveness(schema, liveness_holder(CHILD)))
    taken = app.store.job_claim(["default"], "peer:1:ff", 10, 30.0, expired=True)
    assert [j.id for j in taken] == [child]


def test_a_lock_held_since_before_the_lease_ran_out_vouches_for_nothing(
    app: forklift.App, db: Db, schema: str, vouch: Callable[[str], Db]
) -> None:
    # A worker frozen (SIGSTOP) or wedged keeps its session, and its lock, but renews
    # nothing: it was not cut off, and its lease expires as ever.
    (job_id,) = app.enqueue_many([("plain", {})])
    vouch(ALONE)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = %s,"
        " started_at = now(), lease_until = clock_timestamp() WHERE id = %s",
        (ALONE, job_id),
    )
    taken = app.store.job_claim(["default"], "peer:1:ff", 10, 30.0, expired=True)
    assert [j.id for j in taken] == [job_id]


def test_a_live_owner_renews_its_expired_lease_and_completes_its_job(
    app: forklift.App, db: Db, schema: str, vouch: Callable[[str], Db]
) -> None:
    (job_id,) = app.enqueue_many([("plain", {})])
    expire(db, schema, job_id, CHILD)
    vouch(CHILD)
    assert app.store.job_claim(["default"], "peer:1:ff", 10, 30.0, expired=True) == []
    assert app.store.lease_renew_many([(job_id, 1)], CHILD, 30.0) == {job_id}
    ahead = db.execute(
        f"SELECT lease_until > now() FROM {schema}.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert ahead == (True,)


def test_the_rescue_dead_letters_only_the_jobs_of_owners_nobody_vouches_for(
    app: forklift.App, db: Db, schema: str, vouch: Callable[[str], Db]
) -> None:
    child, alone, gone = app.enqueue_many([("plain", {"n": i}) for i in range(3)])
    for job_id, owner in ((child, CHILD), (alone, ALONE), (gone, GONE)):
        db.execute(f"UPDATE {schema}.jobs SET max_attempts = 1 WHERE id = %s", (job_id,))
        expire(db, schema, job_id, owner)
    vouch(CHILD)
    vouch(ALONE)
    assert app.store.job_rescue_exhausted() == [gone]
    states = db.execute(
        f"SELECT id, state::text FROM {schema}.jobs WHERE id = ANY(%s)", ([child, alone],)
    ).fetchall()
    assert dict(states) == {child: "running", alone: "running"}


@pytest.mark.parametrize("path", ["exact", "shared"])
def test_the_claims_under_limits_spare_vouched_owners_too(
    path: str, app: forklift.App, db: Db, schema: str, vouch: Callable[[str], Db]
) -> None:
    limits = LimitStore(app.store.pool, app.schema, "test")
    limits.register({name: task.limit for name, task in app.tasks.items()})
    child, gone = app.enqueue_many([("limited", {"n": i}) for i in range(2)])
    expire(db, schema, child, CHILD)
    expire(db, schema, gone, GONE)
    vouch(CHILD)
    claim = limits.claim if path == "exact" else limits.claim_shared
    got = claim(["default"], sorted(app.tasks), "peer:1:ff", 10, 30.0, expired=True)
    if path == "shared" and got.declined:  # too close to the limit: the exact path's turn
        got = limits.claim(["default"], sorted(app.tasks), "peer:1:ff", 10, 30.0, expired=True)
    assert [j.id for j in got.jobs] == [gone]
    assert owners(db, schema, [child]) == {child: CHILD}
