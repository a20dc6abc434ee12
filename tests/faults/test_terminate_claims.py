"""pg_terminate_backend of a worker's own connection, again and again, while it claims
and group-commits: a statement whose answer is lost with its
connection is reconciled from the database once it is back, so no job stays leased to
the worker without it knowing (stranded until its lease runs out), and no handler that
finished is counted failed because its completion did commit."""

from __future__ import annotations

import logging
import time
from typing import Any

import psycopg
import pytest

import forklift
from forklift._ids import application_name
from forklift.testing import wait_for
from forklift.workers import Worker
from tests.integration.conftest import RunWorker, app, run_worker

__all__ = ["app", "run_worker"]  # fixtures

KILLS = 60
JOBS = 2000


def terminate(db: psycopg.Connection[Any], worker: Worker) -> int:
    """pg_terminate_backend every session of the worker (its own, its effects', its
    liveness lock's), as an operator's or a failover's storm does."""
    row = db.execute(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = %s",
        (application_name(worker.owner),),
    ).fetchone()
    return 0 if row is None else int(row[0])


def unknown_to(db: psycopg.Connection[Any], schema: str, worker: Worker) -> set[int]:
    """Jobs the database says the worker holds that the worker does not know of."""
    rows = db.execute(
        f"SELECT id FROM {schema}.jobs WHERE state = 'running' AND lease_owner = %s",
        (worker.owner,),
    ).fetchall()
    known = {c.job_id for c in worker.holdings.snapshot()}
    return {r[0] for r in rows} - known


def enqueue(app: forklift.App, n: int) -> None:
    """Plain jobs (group-committed) and jobs with an effect (committed with it)."""
    app.enqueue_many(
        [("effect", {"key": f"k{i}"}) if i % 10 == 0 else ("noop", {}) for i in range(n)]
    )


def left(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE state <> 'succeeded'").fetchone()
    return -1 if row is None else int(row[0])


def test_terminating_the_workers_connection_mid_claim_strands_nothing_and_fails_nothing(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    enqueue(app, JOBS)
    worker = run_worker(concurrency=8, lease=30.0)
    stranded: set[int] = set()
    kills = 0
    for _ in range(KILLS):
        if not left(db, schema):
            enqueue(app, JOBS // 4)
        time.sleep(0.05)  # the worker claiming and completing again
        kills += terminate(db, worker)
        # Within a second of its connection coming back, the worker knows every job
        # the database says it holds (a claim whose answer was lost is reconciled).
        suspects = unknown_to(db, schema, worker)
        if suspects:
            time.sleep(1.5)
            stranded |= suspects & unknown_to(db, schema, worker)
    assert kills >= KILLS // 2, "the worker's sessions were not found to terminate"
    wait_for(lambda: left(db, schema) == 0, timeout=25, what="every job succeeded")
    falsely_failed = [r for r in caplog.records if "job.lease_lost" in r.getMessage()]
    lost_answers = [r for r in caplog.records if "worker.claim_failed" in r.getMessage()]
    reconciled = [r for r in caplog.records if "worker.claim_reconciled" in r.getMessage()]
    print(
        f"{kills} sessions terminated, {len(lost_answers)} claims failed,"
        f" {len(reconciled)} reconciled, {len(stranded)} jobs stranded,"
        f" {len(falsely_failed)} handlers counted failed"
    )
    assert (len(stranded), len(falsely_failed)) == (0, 0), (
        f"{len(stranded)} jobs stranded, {len(falsely_failed)} finished handlers counted "
        f"failed over {kills} terminated sessions"
    )
    # No attempt charged to a plain job (a job with an effect may fail an attempt: its
    # effect transaction was terminated under its handler, and rolled back).
    charged = db.execute(
        f"SELECT id, errors FROM {schema}.jobs WHERE task = 'noop' AND attempts > 1"
    ).fetchall()
    assert charged == []
    twice = db.execute(
        f"SELECT count(*) FROM (SELECT job_id FROM {schema}.effects"
        " GROUP BY job_id HAVING count(*) > 1) AS t"
    ).fetchone()
    assert twice == (0,), "an effect committed twice"
