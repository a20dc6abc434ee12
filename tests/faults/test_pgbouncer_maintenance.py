"""A standalone `forklift worker` behind a transaction-mode PgBouncer maintains the jobs
table: its VACUUM runs on a connection of its own, outside any transaction block."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from forklift.embedded import Cluster
from forklift.testing import ForkliftProcess, wait_for
from tests.faults.bouncer import PgBouncer
from tests.faults.harness import REPO, Workload


@pytest.fixture
def bouncer(cluster: Cluster) -> Iterator[PgBouncer]:
    with PgBouncer(cluster.dsn, "transaction", server_lifetime=3) as b:
        yield b


def test_a_worker_behind_a_transaction_pooler_vacuums_the_jobs_table(
    workload: Workload, bouncer: PgBouncer, tmp_path: Path
) -> None:
    # Dead tuples past the vacuum threshold: the first maintenance round vacuums.
    with workload._db() as db:
        db.execute(
            f"INSERT INTO {workload.schema}.jobs (queue, task, args) "
            "SELECT 'elsewhere', 'work', '{}'::jsonb FROM generate_series(1, 3000)"
        )
        db.execute(f"DELETE FROM {workload.schema}.jobs")
        db.execute("SELECT pg_stat_force_next_flush()")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FORKLIFT_")}
    env.update(
        FORKLIFT_DATABASE_URL=bouncer.dsn,
        FORKLIFT_SESSION_DATABASE_URL=workload.dsn,
        FORKLIFT_SCHEMA=workload.schema,
        FORKLIFT_LOG_FORMAT="text",
        PYTHONPATH=str(REPO),
    )
    worker = ForkliftProcess(["worker", "tests.faults.workload:app"], env, tmp_path / "w.log")
    try:

        def vacuumed_or_failed() -> bool:
            worker.check_alive()  # raises, with its output, if it exited
            count = workload.scalar(
                "SELECT vacuum_count FROM pg_stat_user_tables WHERE relid = '{s}.jobs'::regclass"
            )
            return bool(count) or "maintenance.failed" in worker.output()

        wait_for(vacuumed_or_failed, timeout=30, what="the jobs table vacuumed")
        assert "maintenance.failed" not in worker.output(), worker.output()[-2000:]
        assert "transaction block" not in worker.output()
        assert worker.stop(timeout=30) == 0
    finally:
        worker.kill()
