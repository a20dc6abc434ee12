"""What the parent knows about one child, and the line protocol the child reports in.

The child writes lines to a pipe, one writer at a time (`Reporter` holds a lock):
`H <rss_bytes>` heartbeat, `S <job_id> <timeout|-> <task>` job started, `E <job_id>` job
ended, `M <json>` metric deltas since the last `M`.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forklift.supervisor.exits import ChildFacts
from forklift.supervisor.states import KillReason, RetireReason


@dataclass
class RunningJob:
    job_id: int
    task: str
    started: float
    timeout: float | None

    def overdue(self, now: float) -> bool:
        return self.timeout is not None and now - self.started > self.timeout


@dataclass(frozen=True)
class Kill:
    """Why the supervisor is killing a child, and the cause its jobs will carry."""

    reason: KillReason
    cause: str


@dataclass
class Child:
    """A forked worker process as the parent tracks it."""

    pid: int
    index: int
    owner: str
    pipe: int
    started: float
    last_seen: float
    rss: int = 0
    peak_rss: int = 0
    jobs: dict[int, RunningJob] = field(default_factory=dict)
    idle_since: float | None = None
    # Set when the parent asked it to go (scale down, reload, shutdown).
    retiring: RetireReason | None = None
    # Set when the parent is killing it; the next SIGKILL is due at kill_at.
    killing: Kill | None = None
    kill_at: float | None = None
    timed_out: list[int] = field(default_factory=list)  # jobs charged for their timeout
    generation: int = 0
    on_metrics: Callable[[dict[str, Any]], None] | None = None
    _buffer: bytes = b""

    def read(self, now: float) -> bool:
        """Consume the child's reports; return False once its pipe is closed."""
        while True:
            try:
                chunk = os.read(self.pipe, 65536)
            except BlockingIOError:
                return True
            except OSError:
                return False
            if not chunk:
                return False
            self._buffer += chunk
            *lines, self._buffer = self._buffer.split(b"\n")
            for line in lines:
                self._apply(line.decode("utf-8", "replace"), now)

    def _apply(self, line: str, now: float) -> None:
        self.last_seen = now
        kind, _, rest = line.partition(" ")
        if kind == "H":
            self.rss = int(rest or 0)
            self.peak_rss = max(self.peak_rss, self.rss)
        elif kind == "S":
            job_id, timeout, task = ([*rest.split(" ", 2), "", ""])[:3]
            self.jobs[int(job_id)] = RunningJob(
                int(job_id), task, now, None if timeout == "-" else float(timeout)
            )
            self.idle_since = None
        elif kind == "E":
            self.jobs.pop(int(rest), None)
            if not self.jobs:
                self.idle_since = now
        elif kind == "M" and self.on_metrics is not None:
            try:
                self.on_metrics(json.loads(rest))
            except (ValueError, TypeError, KeyError):
                pass  # a torn report from a dying child: its counts are lost, not wrong

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    def facts(self, now: float) -> ChildFacts:
        """What the exit decision needs to know of this child."""
        return ChildFacts(
            retiring=self.retiring,
            killing=self.killing.reason if self.killing else None,
            timeout_charged=bool(self.timed_out),
            held_jobs=bool(self.jobs),
            uptime=now - self.started,
        )

    def close(self) -> None:
        try:
            os.close(self.pipe)
        except OSError:
            pass


class Reporter:
    """The child's end of the pipe; one lock, so lines from many threads never mix."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def heartbeat(self, rss: int) -> None:
        self._write(f"H {rss}\n")

    def start(self, job_id: int, timeout: float | None, task: str) -> None:
        self._write(f"S {job_id} {'-' if timeout is None else timeout} {task[:200]}\n")

    def end(self, job_id: int) -> None:
        self._write(f"E {job_id}\n")

    def metrics(self, delta: dict[str, Any]) -> None:
        self._write(f"M {json.dumps(delta, separators=(',', ':'))}\n")

    def _write(self, line: str) -> None:
        data = line.encode("utf-8")
        with self._lock:
            try:
                while data:
                    data = data[os.write(self.fd, data) :]
            except OSError:
                pass  # the parent is gone; the child notices through getppid()
