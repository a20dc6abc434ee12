"""Cancelling a running job through the real CLI, wherever it runs: a handler that ignores
ctx.cancelled is killed after --cancel-grace, one that honours it is not; either way the
job ends cancelled and its effect is not committed."""

from __future__ import annotations

import time
from typing import Any

import psycopg

from forklift.testing import wait_for
from tests.acceptance.conftest import cli, cli_json, scalar, wait_state

APP = "tests.apps.operated:app"


def enqueue(env: dict[str, str], task: str, args: str) -> int:
    result = cli(env, "enqueue", APP, task, "--args", args)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def effects(db: psycopg.Connection[Any], schema: str, job_id: int) -> int:
    return int(scalar(db, f"SELECT count(*) FROM {schema}.effects WHERE job_id = %s", job_id))


def test_a_running_job_that_ignores_its_cancel_is_killed_after_the_grace(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    sup = forklift_cli("run", APP, "--workers", "1", "--cancel-grace", "1")
    job_id = enqueue(env, "stubborn", '{"key": "stubborn"}')
    sup.wait_started("stubborn", job_id)
    [victim] = sup.children()
    owner = scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", job_id)
    cancelled_at = time.monotonic()
    answer = cli_json(env, "jobs", "cancel", str(job_id))
    assert answer == [{"id": job_id, "result": "cancelled", "was": "running", "worker": owner}]
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "cancelled"
    wait_for(lambda: victim not in sup.children(), timeout=5, what="its worker killed")
    assert time.monotonic() - cancelled_at < 1 + 1  # the grace, plus a second
    wait_for(lambda: len(sup.children()) == 1, what="a replacement")
    assert "cancelled and ran on past 1 s" in sup.output()
    assert effects(db, schema, job_id) == 0  # its open effect transaction died with it
    # Never retried: still cancelled once the replacement is serving.
    after = enqueue(env, "polite", '{"key": "after", "seconds": 0}')
    wait_state(db, schema, after, "succeeded", timeout=20)
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "cancelled"
    sup.stop_cleanly(timeout=30)


def test_a_handler_that_honours_the_cancel_returns_and_its_worker_lives_on(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    sup = forklift_cli("run", APP, "--workers", "1", "--cancel-grace", "1")
    job_id = enqueue(env, "polite", '{"key": "polite"}')
    sup.wait_started("polite", job_id)
    [worker] = sup.children()
    result = cli(env, "jobs", "cancel", str(job_id))
    assert result.returncode == 0
    assert result.stdout.startswith(f"job {job_id}: cancelled (was running on ")
    wait_for(lambda: f"job.cancelled job={job_id}" in sup.output(), what="the worker saw it end")
    # A job that runs past the grace: had the cancelled one still been timed, its worker
    # would have been killed before this one is done.
    longer = enqueue(env, "polite", '{"key": "longer", "seconds": 1.5}')
    wait_state(db, schema, longer, "succeeded", timeout=20)
    assert sup.children() == [worker]
    assert "child.killing" not in sup.output()
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "cancelled"
    assert effects(db, schema, job_id) == 0  # its completion was refused: rolled back
    assert effects(db, schema, longer) == 1
    sup.stop_cleanly(timeout=30)
