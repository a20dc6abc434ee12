"""The child-to-parent report pipe: one JSON object per line.

Every report is a JSON object whose kind is under "k", written with each non-ASCII and
each control character escaped: a line is printable ASCII up to its one newline, so
nothing inside a report (a task name from anywhere) can end it early or forge another.

    {"k": "heartbeat", "rss": <bytes>}
    {"k": "booted"}                 its worker loop runs: a death from now on is no boot crash
    {"k": "started", "job": <id>, "timeout": <seconds or null>, "task": <name>,
     "grace": <seconds>}       grace (optional, 0): how much later than its timeout to
                                kill (an async handler: the child cancels it itself first)
    {"k": "cancelled", "job": <id>}   an operator cancelled it; its handler still runs
    {"k": "ended", "job": <id>}
    {"k": "metrics", "deltas": <Tally.take()>}

The child writes through `Reporter`, one writer at a time (it holds a lock). The parent
reads through `ReportPipe`, whose `ReportDecoder` takes whole lines and parses each on
its own, strictly: a torn write from a dying child, or any garbage, costs the line it is
in (returned as malformed, for the parent to count) and nothing after it; a line that
grows past MAX_LINE is dropped as it comes, never buffered whole.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

MAX_LINE = 1 << 20  # a metrics report of hundreds of tasks is tens of KB
SAMPLE = 80  # bytes of a malformed line kept for the log


@dataclass(frozen=True)
class Heartbeat:
    rss: int
    ran: int = 0  # jobs that ended since the last heartbeat (tiny ones go untold)


@dataclass(frozen=True)
class Booted:
    pass


@dataclass(frozen=True)
class JobStarted:
    job_id: int
    timeout: float | None
    task: str
    grace: float = 0.0  # seconds past its timeout before the parent kills for it


@dataclass(frozen=True)
class JobCancelled:
    job_id: int


@dataclass(frozen=True)
class JobEnded:
    job_id: int


@dataclass(frozen=True)
class MetricDeltas:
    deltas: dict[str, Any]


Report = Heartbeat | Booted | JobStarted | JobCancelled | JobEnded | MetricDeltas


def encode(report: Report) -> bytes:
    """One report as its line (ASCII, its only newline at the end)."""
    match report:
        case Heartbeat(rss, ran):
            obj: dict[str, Any] = {"k": "heartbeat", "rss": rss, "ran": ran}
        case Booted():
            obj = {"k": "booted"}
        case JobStarted(job_id, timeout, task, grace):
            obj = {"k": "started", "job": job_id, "timeout": timeout, "task": task}
            if grace:
                obj["grace"] = grace
        case JobCancelled(job_id):
            obj = {"k": "cancelled", "job": job_id}
        case JobEnded(job_id):
            obj = {"k": "ended", "job": job_id}
        case MetricDeltas(deltas):
            obj = {"k": "metrics", "deltas": deltas}
    text = json.dumps(obj, ensure_ascii=True, allow_nan=False, separators=(",", ":"))
    return text.encode("ascii") + b"\n"


class Reporter:
    """The child's end of the pipe; one lock, so lines from many threads never mix."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._lock = threading.Lock()

    def heartbeat(self, rss: int, ran: int = 0) -> None:
        self.send(Heartbeat(rss, ran))

    def booted(self) -> None:
        self.send(Booted())

    def start(self, job_id: int, timeout: float | None, task: str, grace: float = 0.0) -> None:
        self.send(JobStarted(job_id, timeout, task[:200], grace))

    def cancelled(self, job_id: int) -> None:
        self.send(JobCancelled(job_id))

    def end(self, job_id: int) -> None:
        self.send(JobEnded(job_id))

    def metrics(self, deltas: dict[str, Any]) -> None:
        self.send(MetricDeltas(deltas))

    def send(self, report: Report) -> None:
        try:
            data = encode(report)
        except ValueError:
            return  # not JSON (a NaN in the counts): this report is lost, not the pipe
        with self._lock:
            try:
                while data:
                    data = data[os.write(self.fd, data) :]
            except OSError:
                pass  # the parent is gone; the child notices through getppid()


# -- decoding ------------------------------------------------------------------------------


def _count(value: Any) -> int | None:
    """A non-negative JSON integer (not a bool), else None."""
    return value if type(value) is int and value >= 0 else None


def _heartbeat(obj: dict[str, Any]) -> Report | None:
    rss, ran = _count(obj.get("rss")), _count(obj.get("ran", 0))
    return None if rss is None or ran is None else Heartbeat(rss, ran)


def _started(obj: dict[str, Any]) -> Report | None:
    job_id, timeout, task = _count(obj.get("job")), obj.get("timeout"), obj.get("task")
    if job_id is None or not isinstance(task, str):
        return None
    if timeout is not None:
        if type(timeout) not in (int, float) or not (math.isfinite(timeout) and timeout > 0):
            return None
        timeout = float(timeout)
    grace = obj.get("grace", 0)
    if type(grace) not in (int, float) or not (math.isfinite(grace) and grace >= 0):
        return None
    return JobStarted(job_id, timeout, task, float(grace))


def _ended(obj: dict[str, Any]) -> Report | None:
    job_id = _count(obj.get("job"))
    return None if job_id is None else JobEnded(job_id)


def _cancelled(obj: dict[str, Any]) -> Report | None:
    job_id = _count(obj.get("job"))
    return None if job_id is None else JobCancelled(job_id)


def _metrics(obj: dict[str, Any]) -> Report | None:
    deltas = obj.get("deltas")
    return MetricDeltas(deltas) if isinstance(deltas, dict) else None


_PARSERS: dict[str, Callable[[dict[str, Any]], Report | None]] = {
    "heartbeat": _heartbeat,
    "booted": lambda obj: Booted(),
    "started": _started,
    "cancelled": _cancelled,
    "ended": _ended,
    "metrics": _metrics,
}


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a report may carry")


def parse_line(line: bytes) -> Report | None:
    """The report one line carries (without its newline); None if it carries none."""
    try:
        obj = json.loads(line.decode("ascii"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not ASCII, not JSON, nested past the stack
        return None
    if not isinstance(obj, dict):
        return None
    kind = obj.get("k")
    parser = _PARSERS.get(kind) if isinstance(kind, str) else None
    return None if parser is None else parser(obj)


@dataclass
class Decoded:
    """What some bytes from a child held: its reports, and the lines that were none."""

    reports: list[Report] = field(default_factory=list)
    malformed: list[bytes] = field(default_factory=list)  # each cut to SAMPLE bytes


class ReportDecoder:
    """Bytes in, reports out; a partial line waits for its end (pure: no I/O)."""

    def __init__(self, max_line: int = MAX_LINE) -> None:
        self.max_line = max_line
        self._partial = bytearray()
        self._skipping = False  # inside a line dropped for its length, until its end

    def feed(self, data: bytes) -> Decoded:
        decoded = Decoded()
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            piece, start = data[start:end], end + 1
            if self._skipping:
                self._skipping = False
                continue
            line = bytes(self._partial + piece) if self._partial else piece
            self._partial.clear()
            self._take(line, decoded)
        if not self._skipping:
            self._partial += data[start:]
            if len(self._partial) > self.max_line:
                decoded.malformed.append(bytes(self._partial[:SAMPLE]))
                self._partial.clear()
                self._skipping = True
        return decoded

    @property
    def partial(self) -> int:
        """Bytes of an unfinished line held, waiting for its end (at most max_line)."""
        return len(self._partial)

    def close(self) -> Decoded:
        """The writer is gone: a line it left unfinished is a torn write."""
        decoded = Decoded()
        if self._partial and not self._skipping:
            decoded.malformed.append(bytes(self._partial[:SAMPLE]))
        self._partial.clear()
        self._skipping = False
        return decoded

    def _take(self, line: bytes, decoded: Decoded) -> None:
        report = parse_line(line) if len(line) <= self.max_line else None
        if report is None:
            decoded.malformed.append(line[:SAMPLE])
        else:
            decoded.reports.append(report)


class ReportPipe:
    """The parent's end of one child's pipe."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._decoder = ReportDecoder()

    def read(self) -> tuple[Decoded, bool]:
        """What was written since the last read, and whether the pipe is still open."""
        decoded = Decoded()
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                return decoded, True
            except OSError:
                chunk = b""
            more = self._decoder.feed(chunk) if chunk else self._decoder.close()
            decoded.reports += more.reports
            decoded.malformed += more.malformed
            if not chunk:
                return decoded, False

    def close(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass
