"""The demo's kill, on a real supervisor: it kills a worker only while the handler of the
job it names runs, since a job whose handler never ran is released uncharged."""

from __future__ import annotations

from typing import Any

import psycopg

import forklift
from forklift.demo.database import DemoStore, Running
from forklift.demo.launch import Supervisor
from forklift.demo.run import kill_busy_worker
from forklift.testing import wait_for
from tests.acceptance.conftest import scalar


def test_the_demo_kills_a_worker_for_the_job_its_handler_runs_not_one_only_claimed(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    proc = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--concurrency", "1")
    app = forklift.App(dsn, schema=schema)
    runs = app.enqueue("effect", {"key": "runs", "sleep": 60})
    wait_for(
        lambda: scalar(db, f"SELECT progress FROM {schema}.jobs WHERE id = %s", runs),
        what="the handler started",
    )
    owner = scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", runs)
    # A job the same worker holds, claimed after the running one and not started: what
    # a claim ahead leaves (made by hand here, so that it stays unstarted).
    waits = app.enqueue("effect", {"key": "waits"}, delay=3600)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = %s, "
        "lease_until = now() + interval '1 hour', started_at = now() + interval '1 second' "
        "WHERE id = %s",
        (owner, waits),
    )
    held = [Running(waits, 2, owner), Running(runs, 1, owner)]  # newest claim first

    with DemoStore(dsn, schema) as store:
        killed = wait_for(
            lambda: kill_busy_worker(Supervisor(proc), store, held), what="a worker killed"
        )
    assert killed == held[1], killed
    wait_for(
        lambda: scalar(db, f"SELECT last_error FROM {schema}.jobs WHERE id = %s", runs),
        what="the running job charged",
    )
    error = scalar(db, f"SELECT last_error FROM {schema}.jobs WHERE id = %s", runs)
    assert error.startswith("WorkerDied: worker process killed by SIGKILL"), error
