"""The job store's error boundary and its effect transaction, against a real PostgreSQL."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

import forklift
from forklift import _db, _sql
from forklift.errors import DatabaseError
from forklift.store import ClaimedJob, Completion, JobStore, claim_statement

OWNER = "test-host:1:store"


@pytest.fixture
def claimed(app: forklift.App, store: JobStore) -> ClaimedJob:
    app.enqueue("noop")
    (job,) = store.job_claim(["default"], OWNER, 1, 30.0, expired=False)
    return job


def scalar(db: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def test_effect_commits_with_the_completion(
    store: JobStore, claimed: ClaimedJob, db: psycopg.Connection[Any], schema: str
) -> None:
    effect = store.effect_begin()
    effect.conn.execute(f"INSERT INTO {schema}.effects (job_id) VALUES (%s)", (claimed.id,))
    assert effect.commit_completing(claimed.id, claimed.attempt, OWNER)
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", claimed.id) == "succeeded"
    assert scalar(db, f"SELECT count(*) FROM {schema}.effects") == 1
    assert isinstance(store.pool, ConnectionPool)
    stats = store.pool.get_stats()
    assert stats["pool_available"] == stats["pool_size"]  # the connection came back


def test_effect_of_a_job_not_ours_rolls_back(
    store: JobStore, claimed: ClaimedJob, db: psycopg.Connection[Any], schema: str
) -> None:
    effect = store.effect_begin()
    effect.conn.execute(f"INSERT INTO {schema}.effects (job_id) VALUES (%s)", (claimed.id,))
    assert not effect.commit_completing(claimed.id, claimed.attempt, "someone-else")
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", claimed.id) == "running"
    assert scalar(db, f"SELECT count(*) FROM {schema}.effects") == 0


def test_a_failed_effect_commit_is_a_database_error(
    store: JobStore, claimed: ClaimedJob, db: psycopg.Connection[Any], schema: str
) -> None:
    db.execute(f"CREATE TABLE {schema}.parents (id integer PRIMARY KEY)")
    db.execute(
        f"CREATE TABLE {schema}.children (parent integer REFERENCES {schema}.parents"
        " DEFERRABLE INITIALLY DEFERRED)"
    )
    effect = store.effect_begin()
    effect.conn.execute(f"INSERT INTO {schema}.children VALUES (1)")  # checked at COMMIT
    with pytest.raises(DatabaseError, match="effect commit failed: ForeignKeyViolation") as caught:
        effect.commit_completing(claimed.id, claimed.attempt, OWNER)
    assert isinstance(caught.value.__cause__, psycopg.errors.ForeignKeyViolation)
    # Nothing committed, the completion included; the connection went back, still good.
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", claimed.id) == "running"
    assert scalar(db, f"SELECT count(*) FROM {schema}.children") == 0
    with store.pool.connection() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_pool_errors_leave_the_store_as_database_errors(store: JobStore) -> None:
    store.pool.close()
    with pytest.raises(DatabaseError, match=r"^claim failed: ") as caught:
        store.job_claim(["default"], OWNER, 1, 30.0, expired=False)
    assert isinstance(caught.value.__cause__, psycopg.Error)
    with pytest.raises(DatabaseError, match=r"^effect transaction failed: "):
        store.effect_begin()


def test_a_lost_job_keeps_its_place_in_line(
    app: forklift.App, store: JobStore, db: psycopg.Connection[Any], schema: str
) -> None:
    # A job whose worker froze: still `running`, its lease just expired. It was due ten
    # minutes ago; a backlog behind it has been due for five. Re-run, it goes first, by
    # when it was due, not by when its lease happened to run out.
    lost = app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'frozen:1:x',"
        " available_at = now() - interval '10 minutes', lease_until = now() - interval '1 second'"
        " WHERE id = %s",
        (lost,),
    )
    backlog = app.enqueue_many([("noop", {}) for _ in range(20)])
    db.execute(
        f"UPDATE {schema}.jobs SET available_at = now() - interval '5 minutes' WHERE id = ANY(%s)",
        (backlog,),
    )
    claimed = store.job_claim(["default"], OWNER, 5, 30.0, expired=True)
    assert {j.id for j in claimed} == {lost, *backlog[:4]}
    # Higher priority still comes first, lost or not.
    urgent = app.enqueue("noop", priority=1)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'frozen:1:x',"
        " lease_until = now() - interval '1 second' WHERE id = %s",
        (urgent,),
    )
    claimed = store.job_claim(["default"], OWNER, 2, 30.0, expired=True)
    assert {j.id for j in claimed} == {urgent, backlog[4]}


def test_a_worker_connection_is_kept_alive_on_both_ends(dsn: str) -> None:
    timeouts = _db.Timeouts.for_lease(30.0)
    with _db.connect(dsn, timeouts) as conn:
        settings = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN"
                " ('tcp_keepalives_idle', 'tcp_keepalives_interval', 'tcp_keepalives_count',"
                " 'tcp_user_timeout')"
            ).fetchall()
        )
        over_tcp = not conn.info.host.startswith("/")
    if not over_tcp:
        # Over a Unix socket PostgreSQL reports 0 for every keepalive: no TCP to keep alive.
        assert set(settings.values()) == {"0"}
        return
    assert settings == {
        "tcp_keepalives_idle": str(round(timeouts.keepalive_idle)),
        "tcp_keepalives_interval": str(round(timeouts.keepalive_interval)),
        "tcp_keepalives_count": str(timeouts.keepalive_count),
        "tcp_user_timeout": str(int(timeouts.tcp_user * 1000)),
    }


def test_forklifts_own_connections_have_jit_off_and_effect_connections_the_servers(
    dsn: str, db: Any
) -> None:
    """A claim under limits estimated past jit_above_cost was JIT-compiled each time
    (0.4 s for a 12 ms statement); a handler's effect connection keeps what the server
    says."""
    from forklift import _db

    server = db.execute("SELECT reset_val FROM pg_settings WHERE name = 'jit'").fetchone()[0]
    for own, expected in ((True, "off"), (False, server)):
        pool = _db.make_pool(dsn, _db.Timeouts(), max_size=1, name=f"jit-{own}", own=own)
        pool.open(wait=True)
        try:
            with pool.connection() as conn:
                assert conn.execute("SHOW jit").fetchone() == (expected,)
        finally:
            pool.close()


def test_the_one_queue_claim_takes_what_the_general_claim_would(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    # job_claim_one (one queue, no expiry scan: a worker's usual claim) and job_claim must
    # agree on every rule: priority, then due time, then id; delayed, limited, other
    # queues' and paused queues' jobs left alone.
    queries = _sql.load("forklift.store", "queries.sql", schema)
    plain = app.enqueue_many([("noop", {}) for _ in range(3)])
    urgent = app.enqueue("noop", priority=5)
    least = app.enqueue("noop", priority=-1)
    app.enqueue("noop", delay=600)
    app.enqueue("noop", queue="other")
    limited = app.enqueue("noop")
    db.execute(f"UPDATE {schema}.jobs SET limit_key = 'k' WHERE id = %s", (limited,))
    early = app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET available_at = now() - interval '1 hour' WHERE id = %s",
        (early,),
    )

    def claim(name: str, limit: int, queue: str = "default") -> list[int]:
        params = {"queue": queue, "queues": [queue], "owner": OWNER, "limit": limit,
                  "lease": 30.0, "expired": False, "alone": True, "floor": None,
                  "labels": []}  # fmt: skip
        with db.transaction(force_rollback=True):
            rows = [r for r in db.execute(queries[name], params).fetchall() if r[0] is not None]
            assert all(state == "running" for (state,) in db.execute(
                f"SELECT state FROM {schema}.jobs WHERE id = ANY(%s)", ([r[0] for r in rows],)
            ))  # fmt: skip
        return sorted(r[0] for r in rows)

    order = [urgent, early, *plain, least]
    for limit in range(1, 9):
        expected = sorted(order[:limit])
        assert claim("job_claim_one", limit) == claim("job_claim", limit) == expected, limit
    db.execute(f"INSERT INTO {schema}.paused_queues (queue, paused_by) VALUES ('default', 't')")
    assert claim("job_claim_one", 10) == claim("job_claim", 10) == []
    assert claim("job_claim_one", 10, "other") == claim("job_claim", 10, "other") != []


def test_a_claim_that_did_not_fill_says_when_the_next_ready_job_is_due(
    app: forklift.App, store: JobStore
) -> None:
    # A worker sleeps until then without a lookup of its own: the jobs the claim took are
    # left out (its snapshot still sees them ready), other queues' too; a claim that
    # filled, one that took nothing, and the general claim do not look.
    def claim(limit: int, queues: tuple[str, ...] = ("default",)) -> tuple[int, Any]:
        made = store.job_claim_next((), queues, OWNER, limit, 30.0, expired=False)
        return len(made.jobs), made.next_due

    app.enqueue_many([("noop", {}) for _ in range(3)])
    app.enqueue("noop", queue="other")
    app.enqueue("noop", delay=600)
    assert claim(2) == (2, None)  # filled: it did not look
    taken, due = claim(5)  # the last ready one: the delayed job is next
    assert taken == 1 and due is not None and due[0] == pytest.approx(600, abs=60)
    app.enqueue("noop")
    assert claim(5, ("default", "x")) == (1, None)  # the general claim does not look
    assert claim(5) == (0, None)  # took nothing: the caller looks itself
    app.enqueue("noop", queue="other")
    assert claim(5, ("other",)) == (2, (None,))  # nothing more ready there


@pytest.mark.parametrize(("queues", "expired"), [(["default"], False), (["default", "x"], True)])
def test_a_claim_alone_commits_without_waiting_for_its_flush_and_one_with_completions_waits(
    app: forklift.App, store: JobStore, schema: str, queues: list[str], expired: bool
) -> None:
    # What the claim leaves set for its own transaction is what that transaction commits
    # with: synchronous_commit off for a claim alone; as configured (on) for one that
    # carries completions, which must survive a crash.
    app.enqueue_many([("noop", {}) for _ in range(3)])
    (job,) = store.job_claim(queues, OWNER, 1, 30.0, expired=expired)
    done: Completion = (job.id, job.attempt, None, None)
    for alone in (True, False):
        carried = () if alone else [done]
        statement, params = claim_statement(store.q, queues, OWNER, 1, 30.0, expired, carried, None)
        with store.pool.connection() as conn, conn.transaction(force_rollback=True):
            assert len(conn.execute(statement, params).fetchall()) == 1
            assert scalar(conn, "SELECT current_setting('synchronous_commit')") == (
                "off" if alone else "on"
            )
    made = store.job_claim_next([done], queues, OWNER, 1, 30.0, expired=expired)
    assert made.completed == {job.id} and len(made.jobs) == 1
