"""The child-to-parent report pipe: one line per report, `<kind> <fields>`.

The child writes through `Reporter`, one writer at a time (it holds a lock):

    heartbeat <rss_bytes>
    started <job_id> <timeout_seconds|-> <task>
    cancelled <job_id>          (an operator cancelled it; its handler still runs)
    ended <job_id>
    metrics <json of Tally.take()>

The parent reads whole lines through `ReportPipe` and parses each with `parse_report`.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Heartbeat:
    rss: int


@dataclass(frozen=True)
class JobStarted:
    job_id: int
    timeout: float | None
    task: str


@dataclass(frozen=True)
class JobCancelled:
    job_id: int


@dataclass(frozen=True)
class JobEnded:
    job_id: int


@dataclass(frozen=True)
class MetricDeltas:
    deltas: dict[str, Any]


Report = Heartbeat | JobStarted | JobCancelled | JobEnded | MetricDeltas


class Reporter:
    """The child's end of the pipe; one lock, so lines from many threads never mix."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def heartbeat(self, rss: int) -> None:
        self._write(f"heartbeat {rss}\n")

    def start(self, job_id: int, timeout: float | None, task: str) -> None:
        self._write(f"started {job_id} {'-' if timeout is None else timeout} {task[:200]}\n")

    def cancelled(self, job_id: int) -> None:
        self._write(f"cancelled {job_id}\n")

    def end(self, job_id: int) -> None:
        self._write(f"ended {job_id}\n")

    def metrics(self, deltas: dict[str, Any]) -> None:
        self._write(f"metrics {json.dumps(deltas, separators=(',', ':'))}\n")

    def _write(self, line: str) -> None:
        data = line.encode("utf-8")
        with self._lock:
            try:
                while data:
                    data = data[os.write(self.fd, data) :]
            except OSError:
                pass  # the parent is gone; the child notices through getppid()


def parse_report(line: str) -> Report | None:
    """The report a line carries; None for a line that is not one (a torn write)."""
    kind, _, rest = line.partition(" ")
    try:
        if kind == "heartbeat":
            return Heartbeat(int(rest or 0))
        if kind == "started":
            job_id, timeout, task = [*rest.split(" ", 2), "", ""][:3]
            return JobStarted(int(job_id), None if timeout == "-" else float(timeout), task)
        if kind == "cancelled":
            return JobCancelled(int(rest))
        if kind == "ended":
            return JobEnded(int(rest))
        if kind == "metrics":
            deltas = json.loads(rest)
            return MetricDeltas(deltas) if isinstance(deltas, dict) else None
    except ValueError:
        return None
    return None


class ReportPipe:
    """The parent's end of one child's pipe: whole lines; a partial line waits for its end."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._partial = b""

    def read(self) -> tuple[list[str], bool]:
        """The complete lines written since the last read, and whether the pipe is open."""
        lines: list[str] = []
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return lines, True
            except OSError:
                return lines, False
            if not chunk:
                return lines, False
            *whole, self._partial = (self._partial + chunk).split(b"\n")
            lines += (line.decode("utf-8", "replace") for line in whole)

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
