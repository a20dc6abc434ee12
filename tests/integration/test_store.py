"""The job store's error boundary and its effect transaction, against a real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.errors import DatabaseError
from forklift.store import ClaimedJob, JobStore

OWNER = "test-host:1:store"


@pytest.fixture
def store(dsn: str, schema: str) -> Iterator[JobStore]:
    pool = _db.make_pool(dsn, _db.Timeouts(), max_size=2, name="test-store")
    pool.open(wait=True, timeout=10)
    yield JobStore(pool, schema)
    pool.close()


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
    assert store.pool.get_stats()["pool_available"] == store.pool.get_stats()["pool_size"]


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
