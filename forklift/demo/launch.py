"""The real supervisor, `forklift run forklift.demo.mandelbrot:app`, as the demo's child."""

from __future__ import annotations

import json
import os
import urllib.request
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from forklift.demo.database import Place
from forklift.demo.interrupts import Interrupts
from forklift.errors import ForkliftError
from forklift.testing import ForkliftProcess

APP = "forklift.demo.mandelbrot:app"
STOP_TIMEOUT = 10.0  # then the supervisor and its workers are SIGKILLed


class DemoError(ForkliftError):
    """The demo could not run to its end."""


class SupervisorLog:
    """The supervisor's JSON log, read as it grows: one dict per event line."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.metrics_addr: str | None = None
        self._offset = 0
        self._partial = b""

    def events(self) -> list[dict[str, Any]]:
        """The events logged since the last call (a line still being written waits)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except OSError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        found = []
        for line in lines:
            try:
                entry = json.loads(line)
            except ValueError:  # not an event: a traceback, say
                continue
            if isinstance(entry, dict) and "event" in entry:
                if entry["event"] == "supervisor.http":
                    self.metrics_addr = str(entry.get("addr"))
                found.append(entry)
        return found


class Supervisor:
    """`forklift run` in its own session, its log in a file, stopped by the demo's stack."""

    def __init__(self, proc: ForkliftProcess) -> None:
        self.proc = proc
        self.log = SupervisorLog(proc.log_path)

    @classmethod
    def start(
        cls, place: Place, workers: int, log_path: Path, stack: ExitStack, interrupts: Interrupts
    ) -> Supervisor:
        env = dict(os.environ, FORKLIFT_DATABASE_URL=place.dsn, FORKLIFT_SCHEMA=place.schema)
        env.pop("DATABASE_URL", None)
        args = [
            "run", APP, "--workers", str(workers), "--concurrency", "1",
            "--metrics-addr", "127.0.0.1:0", "--log-format", "json", "--grace", "5s",
        ]  # fmt: skip
        with interrupts.shielded():  # a supervisor started is a supervisor stopped
            proc = ForkliftProcess(args, env, log_path)
            stack.callback(interrupts.shield(lambda: proc.stop(timeout=STOP_TIMEOUT)))
        return cls(proc)

    @property
    def command(self) -> str:
        return f"forklift {' '.join(self.proc.args)}"

    def workers(self) -> list[int]:
        """The pids of its worker processes now."""
        return self.proc.children()

    def check_alive(self) -> None:
        try:
            self.proc.check_alive()
        except RuntimeError as exc:
            raise DemoError(f"the supervisor stopped before the demo was done: {exc}") from None

    def signal_worker(self, pid: int, signum: int) -> bool:
        """Send `signum` to `pid` if it is one of this supervisor's workers (only those)."""
        if pid not in self.workers():
            return False
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            return False
        return True

    def restarts(self) -> int | None:
        """forklift_worker_restarts_total from its /metrics, all reasons (None: unreadable)."""
        self.log.events()
        if not self.log.metrics_addr:
            return None
        try:
            with urllib.request.urlopen(f"http://{self.log.metrics_addr}/metrics", timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return None
        return round(
            sum(
                s.value
                for family in text_string_to_metric_families(text)
                for s in family.samples
                if s.name == "forklift_worker_restarts_total"
            )
        )

    def stop(self) -> int:
        """SIGTERM, wait for the graceful stop; its exit code (SIGKILLed past the timeout)."""
        return self.proc.stop(timeout=STOP_TIMEOUT)
