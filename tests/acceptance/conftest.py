"""Acceptance fixtures: the real `forklift` CLI under Popen, real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from signal import SIGTERM
from typing import Any

import psycopg
import pytest

from tests.conftest import wait_for


class Proc:
    """A forklift process whose output goes to a file (never a full pipe)."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log_path = log
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "forklift", *args],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # our signals only; Ctrl-C of pytest stays ours
        )
        self.pid = self.popen.pid

    @property
    def output(self) -> str:
        return self.log_path.read_text()

    def signal(self, signum: int) -> None:
        self.popen.send_signal(signum)

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def titles(self) -> list[str]:
        """The process titles of the children (`forklift worker 1/2 [...]: running x#7`)."""
        found = []
        for pid in self.children():
            try:
                found.append(Path(f"/proc/{pid}/cmdline").read_bytes().decode().strip("\0 "))
            except OSError:
                pass
        return found

    def wait_started(self, task: str, job_id: int) -> None:
        """Until a child's title says it runs the job: its handler has begun."""
        wait_for(
            lambda: any(t.endswith(f"running {task}#{job_id}") for t in self.titles()),
            what=f"{task}#{job_id} started in a child",
        )

    def wait(self, timeout: float) -> int:
        return self.popen.wait(timeout=timeout)

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
                f"output:\n{self.output[-4000:]}"
            )
        assert code == 0, self.output[-3000:]
        return time.monotonic() - started

    def stop(self) -> None:
        if self.popen.poll() is None:
            for pid in self.children():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            self.popen.kill()
            self.popen.wait(timeout=10)
        self._log.close()


@pytest.fixture
def forklift_cli(env: dict[str, str], tmp_path: Path) -> Iterator[Any]:
    procs: list[Proc] = []

    def start(*args: str) -> Proc:
        proc = Proc(list(args), env, tmp_path / f"forklift-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        proc.stop()


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
