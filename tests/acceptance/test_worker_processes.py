"""Worker processes under the real CLI: racing, freezing, signals."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import ForkliftProcess, process_title, wait_for
from tests.acceptance.conftest import released


@pytest.fixture
def spawn(env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    procs: list[ForkliftProcess] = []

    def start(*flags: str) -> ForkliftProcess:
        log = tmp_path / f"worker-{len(procs)}.log"
        proc = ForkliftProcess(["worker", "tests.apps.basic:app", *flags], env, log)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.signal(signal.SIGCONT)  # a frozen one cannot die of SIGKILL before it runs
        proc.kill()


def scalar(db: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def test_racing_workers_commit_every_effect_exactly_once(
    dsn: str, schema: str, db: psycopg.Connection[Any], spawn: Any
) -> None:
    n = 5000
    app = forklift.App(dsn, schema=schema)
    app.enqueue_many([("effect", {"key": str(i), "n": i}) for i in range(n)])
    workers = [spawn("--concurrency", "4", "--log-level", "WARNING") for _ in range(3)]
    wait_for(
        lambda: scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'") == n,
        timeout=90,
        interval=0.2,
        what=f"{n} jobs succeeded",
    )
    assert scalar(db, f"SELECT count(*) FROM {schema}.effects") == n
    assert scalar(db, f"SELECT count(DISTINCT key) FROM {schema}.effects") == n
    assert scalar(db, f"SELECT max(attempts) FROM {schema}.jobs") == 1
    # All three were up and connected while the jobs were there for the taking.
    names = [f"forklift-worker:{w.pid}:%" for w in workers]
    connected = scalar(
        db,
        "SELECT count(DISTINCT application_name) FROM pg_stat_activity"
        " WHERE application_name LIKE ANY(%s)",
        names,
    )
    assert connected == 3
    for w in workers:
        w.signal(signal.SIGTERM)
    for w in workers:
        assert w.wait(timeout=15) == 0
    app.close()


def test_frozen_worker_cannot_complete_a_job_taken_over(
    dsn: str, schema: str, db: psycopg.Connection[Any], spawn: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("effect", {"key": "once", "sleep": 1.0})
    frozen = spawn("--lease", "2", "--log-level", "INFO")
    wait_for(
        lambda: scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "running",
        what="first worker running the job",
    )
    frozen.signal(signal.SIGSTOP)
    wait_for(
        lambda: scalar(db, f"SELECT lease_until < now() FROM {schema}.jobs WHERE id = %s", job_id),
        timeout=10,
        what="lease expired",
    )
    spawn("--lease", "2", "--log-level", "WARNING")
    wait_for(
        lambda: scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "succeeded",
        timeout=15,
        what="second worker completed the job",
    )
    frozen.signal(signal.SIGCONT)
    # The frozen one wakes mid-handler; its effect and completion must both be refused.
    wait_for(lambda: "job.lease_lost" in frozen.output(), what="the frozen one's refusal")
    frozen.signal(signal.SIGTERM)
    assert frozen.wait(timeout=15) == 0
    assert scalar(db, f"SELECT count(*) FROM {schema}.effects") == 1
    row = db.execute(
        f"SELECT attempts, errors->0->>'error' FROM {schema}.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row is not None
    assert row[0] == 2 and row[1].startswith("LeaseExpired")
    app.close()


def test_sigterm_exits_zero_and_releases_the_job(
    dsn: str, schema: str, db: psycopg.Connection[Any], spawn: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 60})
    proc = spawn("--grace", "1")
    wait_for(
        lambda: scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "running",
        what="job running",
    )
    started = time.monotonic()
    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert time.monotonic() - started < 5
    assert released(db, schema, job_id)
    app.close()


def test_a_standalone_worker_is_titled_and_registered_until_it_stops(
    dsn: str, schema: str, db: psycopg.Connection[Any], spawn: Any, env: dict[str, str]
) -> None:
    worker = spawn("--log-level", "WARNING", "--grace", "1")
    wait_for(
        lambda: process_title(worker.pid) == "forklift worker [default]: idle",
        what="titled",
    )

    def rows() -> list[dict[str, Any]]:
        out = subprocess.run(
            [sys.executable, "-m", "forklift", "ps", "--json"],
            env=env, capture_output=True, text=True, check=True,
        )  # fmt: skip
        return list(json.loads(out.stdout))

    listed = wait_for(lambda: rows(), what="registered")
    assert [(r["kind"], r["pid"], r["supervisor_id"]) for r in listed] == [
        ("worker", worker.pid, None)
    ]
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 30})
    wait_for(
        lambda: process_title(worker.pid) == f"forklift worker [default]: running sleep#{job_id}",
        what="the title shows the job",
    )
    worker.signal(signal.SIGTERM)
    assert worker.wait(timeout=15) == 0
    assert rows() == []  # deregistered
    app.close()
