"""A claim locks no job it does not take: a job it locks, another claim skips."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from forklift import _sql

QUEUES = ["q0", "q1", "q2", "q3"]


def claim_sql(schema: str, queues: list[str], limit: int, expired: bool) -> tuple[str, Any]:
    params = {"queues": queues, "owner": "host:1:w", "limit": limit, "lease": 30.0,
              "expired": expired, "alone": True, "labels": []}  # fmt: skip
    return _sql.load("forklift.store", "queries.sql", schema)["job_claim"], params


def lockable(dsn: str, schema: str) -> int:
    """Ready jobs another transaction could lock now (its snapshot still sees an
    uncommitted claim's jobs ready: those are locked)."""
    with psycopg.connect(dsn) as other:
        row = other.execute(
            f"SELECT count(*) FROM (SELECT id FROM {schema}.jobs WHERE state = 'ready'"
            " FOR UPDATE SKIP LOCKED) AS free"
        ).fetchone()
        other.rollback()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("expired", [False, True])
def test_a_claim_of_many_queues_locks_only_the_jobs_it_takes(
    dsn: str, db: psycopg.Connection[Any], schema: str, expired: bool
) -> None:
    """It locked its limit in each queue, then took its limit of them all: 20 jobs
    locked for 5 taken, 15 that other workers' claims skipped meanwhile."""
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task, priority)"
        " SELECT q, 'noop', (i %% 3)::smallint FROM unnest(%s::text[]) AS q,"
        " generate_series(1, 20) AS i",
        (QUEUES,),
    )
    with psycopg.connect(dsn) as claimer:
        taken = claimer.execute(*claim_sql(schema, QUEUES, 5, expired)).fetchall()
        first = db.execute(
            f"SELECT id FROM {schema}.jobs ORDER BY priority DESC, available_at, id LIMIT 5"
        ).fetchall()
        assert sorted(r[0] for r in taken) == sorted(r[0] for r in first)  # in line order
        assert 80 - lockable(dsn, schema) == 5
        claimer.rollback()


def test_claims_side_by_side_each_take_their_limit_past_the_others_jobs(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    # The first claim, not yet committed, holds the urgent queue's 5 jobs: the second,
    # whose snapshot still sees them ready, takes 5 of the next queue's instead of none.
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task, priority)"
        " SELECT 'urgent', 'noop', 5 FROM generate_series(1, 5)"
        " UNION ALL SELECT 'q0', 'noop', 0 FROM generate_series(1, 20)"
    )
    queues = ["urgent", "q0"]
    with psycopg.connect(dsn) as first, psycopg.connect(dsn) as second:
        ahead = first.execute(*claim_sql(schema, queues, 5, False)).fetchall()
        assert {r[1] for r in ahead} == {"urgent"} and len(ahead) == 5
        behind = second.execute(*claim_sql(schema, queues, 5, True)).fetchall()
        assert {r[1] for r in behind} == {"q0"} and len(behind) == 5
        assert 25 - lockable(dsn, schema) == 10
        first.rollback()
        second.rollback()
