"""What a newcomer meets first, through the real CLI: before migrate, progress, names."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Iterator
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
    wait_for(lambda: "worker.schema_missing" in sup.output(), what="the worker says it too")
    hint = [line for line in sup.output().splitlines() if "worker.schema_missing" in line]
    assert len(hint) == 1  # one calm line, not one per retry
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
    app.close()
    sup.stop_cleanly()
