"""Acceptance fixtures: the real `forklift` CLI under Popen, real signals."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from signal import SIGTERM
from typing import Any

import psycopg
import pytest

from forklift.testing import ForkliftProcess, wait_for


class Proc(ForkliftProcess):
    """A forklift process under test, with the checks acceptance tests make of it."""

    def wait_started(self, task: str, job_id: int) -> None:
        """Until a child's title says it runs the job: its handler has begun."""
        wait_for(
            lambda: any(t.endswith(f"running {task}#{job_id}") for t in self.titles()),
            what=f"{task}#{job_id} started in a child",
        )

    def stop_cleanly(self, signum: int = SIGTERM, timeout: float = 30.0) -> float:
        """Send `signum`, require exit code 0; return how many seconds the stop took."""
        started = time.monotonic()
        self.signal(signum)
        try:
            code = self.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            titles = "\n".join(self.titles())
            pytest.fail(
                f"no exit {timeout}s after {signum}; children:\n{titles}\n"
                f"output:\n{self.output()[-4000:]}"
            )
        assert code == 0, self.output()[-3000:]
        return time.monotonic() - started


@pytest.fixture
def forklift_cli(env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    procs: list[Proc] = []

    def start(*args: str) -> Proc:
        proc = Proc(list(args), env, tmp_path / f"forklift-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.kill()


def scalar(db: psycopg.Connection[Any], sql: str, *params: Any) -> Any:
    row = db.execute(sql, params).fetchone()
    assert row is not None
    return row[0]


def released(db: psycopg.Connection[Any], schema: str, job_id: int) -> bool:
    """Back to ready, attempt not counted, no owner: what a graceful release leaves."""
    row = db.execute(
        f"SELECT state, attempts, lease_owner FROM {schema}.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    return row == ("ready", 0, None)


def still_serves(app: Any, db: psycopg.Connection[Any], schema: str, sup: Proc) -> None:
    """The supervisor is up and a fresh job still gets done."""
    job_id = app.enqueue("noop")
    wait_state(db, schema, job_id, "succeeded", timeout=20)
    assert sup.popen.poll() is None


def wait_state(
    db: psycopg.Connection[Any], schema: str, job_id: int, state: str, timeout: float = 10.0
) -> None:
    wait_for(
        lambda: scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == state,
        timeout=timeout,
        what=f"job {job_id} {state}",
    )


def metrics_url(sup: ForkliftProcess) -> str:
    match = wait_for(
        lambda: re.search(r"supervisor\.http addr=([\d.]+:\d+)", sup.output()), what="http addr"
    )
    return f"http://{match[1]}"


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """One `forklift ARGS...` command run to its end, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "forklift", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli_json(env: dict[str, str], *args: str, code: int = 0) -> Any:
    """`forklift ARGS... --json`, its exit code checked, its output parsed."""
    result = cli(env, *args, "--json")
    assert result.returncode == code, result.stderr + result.stdout
    return json.loads(result.stdout)
