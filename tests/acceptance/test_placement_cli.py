"""Worker labels and job cost through the real CLI: jobs that require a label wait,
visibly (status, /metrics), while no worker has it, run once one started with
`--labels` comes (ps shows its labels); `forklift run` refuses queues whose tasks cost
more slots than its workers have, before it forks."""

from __future__ import annotations

from typing import Any

import psycopg

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import cli, cli_json, get, metrics_url


def states(db: psycopg.Connection[Any], schema: str, task: str) -> list[str]:
    rows = db.execute(f"SELECT state FROM {schema}.jobs WHERE task = %s", (task,))
    return [r[0] for r in rows]


def test_jobs_that_require_a_label_wait_visibly_for_a_worker_that_has_it(
    dsn: str, env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    plain = forklift_cli("run", "tests.apps.placed:app", "--workers", "1")
    app.enqueue_many([("render", {})] * 3 + [("plain", {})] * 2)
    wait_for(lambda: states(db, schema, "plain") == ["succeeded"] * 2, what="plain jobs run")
    assert states(db, schema, "render") == ["ready"] * 3
    status = cli(env, "status")
    assert status.returncode == 0, status.stderr
    header, row = status.stdout.splitlines()[:2]
    assert "no worker" in header and row.split()[:7] == ["default", "-", "3", "0", "0", "0", "3"]
    assert "start one with --labels" in status.stdout
    assert [q["unrunnable"] for q in cli_json(env, "status")] == [3]
    wait_for(
        lambda: (
            'forklift_queue_unrunnable{queue="default"} 3.0'
            in get(metrics_url(plain) + "/metrics")[1]
        ),
        what="the gauge counts them",
    )
    gpu = forklift_cli("worker", "tests.apps.placed:app", "--labels", "gpu")
    wait_for(lambda: states(db, schema, "render") == ["succeeded"] * 3, what="gpu jobs run")
    wait_for(
        lambda: any(p["labels"] == ["gpu"] for p in cli_json(env, "ps")),
        what="the labelled worker registered",
    )
    assert "default [gpu]" in cli(env, "ps").stdout
    assert "no worker" not in cli(env, "status").stdout
    gpu.stop_cleanly(timeout=30)
    plain.stop_cleanly(timeout=30)
    app.close()


def test_run_refuses_queues_whose_tasks_cost_more_slots_than_its_workers_have(
    env: dict[str, str],
) -> None:
    result = cli(env, "run", "tests.apps.placed:app", "--queues", "default,big")
    assert result.returncode == 1, result.stdout + result.stderr
    assert "task 'heavy' costs 2 slots, more than this worker's concurrency (1)" in result.stderr
    assert "forklift.supervisor" not in result.stderr  # refused before anything started
    bad = cli(env, "run", "tests.apps.placed:app", "--labels", "gpu,bell\x07")
    assert bad.returncode == 2 and "control character" in bad.stderr, bad.stderr
