"""What a newcomer meets first, through the real CLI: before migrate, progress, names."""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import get, metrics_url, wait_state


@pytest.fixture
def unmigrated(dsn: str, env: dict[str, str]) -> Iterator[str]:
    """A schema name nobody has migrated yet (env points at it); dropped afterwards."""
    name = f"t_{secrets.token_hex(5)}"
    env["FORKLIFT_SCHEMA"] = name
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def test_run_before_migrate_waits_not_ready_then_works_once_migrated(
    dsn: str, unmigrated: str, env: dict[str, str], forklift_cli: Any
) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    _status, body = wait_for(
        lambda: (r := get(url + "/readyz"))[0] == 503 and "migrate" in r[1] and r,
        what="not ready, saying to migrate",
    )
    assert f'schema "{unmigrated}"' in body and "run forklift migrate" in body

    # Every service and worker finds the tables missing: the supervisor says so in one
    # line, and every process's title says what it waits for.
    def titles() -> list[str]:
        pids = [sup.pid, *sup.children()]
        return [Path(f"/proc/{p}/cmdline").read_bytes().decode().strip("\0") for p in pids]

    wait_for(
        lambda: len(t := titles()) == 2 and all("waiting for migrate" in x for x in t),
        what="the supervisor's and the worker's titles saying they wait for migrate",
    )
    time.sleep(2.5)  # a few rounds of every service: none of them may say it again
    warned = [line for line in sup.output().splitlines() if "WARNING" in line]
    assert len(warned) == 1 and "supervisor.waiting_for_migrate" in warned[0], warned
    assert "run forklift migrate" in warned[0]
    assert "LINE 1" not in sup.output() and "Traceback" not in sup.output()
    # A one-shot command says the same, and exits 1.
    status_cmd = subprocess.run(
        [sys.executable, "-m", "forklift", "status"], env=env, capture_output=True, text=True
    )
    assert status_cmd.returncode == 1
    assert "run forklift migrate" in status_cmd.stderr
    # The migration (as a Kubernetes Job would run it) arrives; work starts by itself.
    migrated = subprocess.run(
        [sys.executable, "-m", "forklift", "migrate"], env=env, capture_output=True, text=True
    )
    assert migrated.returncode == 0, migrated.stderr
    app = forklift.App(dsn, schema=unmigrated)
    with psycopg.connect(dsn, autocommit=True) as db:
        job_id = app.enqueue("noop")
        wait_state(db, unmigrated, job_id, "succeeded", timeout=10)
    wait_for(lambda: get(url + "/readyz")[0] == 200, what="ready once migrated")
    wait_for(
        lambda: not any("waiting for migrate" in t for t in titles()), what="titles back to work"
    )
    app.close()
    sup.stop_cleanly()
