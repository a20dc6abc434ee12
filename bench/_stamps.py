"""Handler-entry stamps in a file, and the pacing of a latency producer (stdlib only).

bench.compare runs forklift, its peers and a bare psycopg loop in different
interpreters (the peers in their own venv), so what they share is here, with no import
of forklift or of any peer. A handler's first act is `stamp(key, enqueued_at)`: one line
`key pid enqueued_at started_at` appended (O_APPEND, one write, so lines from many
processes and threads never interleave) to the file named by $BENCH_STAMPS. Both times
are `time.time()` on this machine: one clock for every process. The producer side sends
`ticks(n, rate)` jobs, each with the time.time() read just before its enqueue call.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ENV = "BENCH_STAMPS"


@dataclass(frozen=True)
class Stamp:
    """One handler entry: the job's key, the process that ran it, and the two times."""

    key: str
    pid: int
    enqueued_at: float
    started_at: float

    @property
    def latency_ms(self) -> float:
        return (self.started_at - self.enqueued_at) * 1000


def stamp(key: object, enqueued_at: float = 0.0) -> None:
    """Record, now, that the handler of job `key` started (call it first in the handler)."""
    started_at = time.time()
    line = f"{key} {os.getpid()} {enqueued_at!r} {started_at!r}\n"
    fd = os.open(os.environ[ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def read(path: Path) -> list[Stamp]:
    """Every complete line of the stamps file, in the order written."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    stamps = []
    for line in text.splitlines(keepends=True):
        if line.endswith("\n"):
            key, pid, enqueued, started = line.split()
            stamps.append(Stamp(key, int(pid), float(enqueued), float(started)))
    return stamps


def wait_key(path: Path, key: str, timeout: float, count: int = 1) -> list[Stamp]:
    """Wait until `key` has been stamped `count` times; its stamps (fewer at the timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [s for s in read(path) if s.key == key]
        if len(found) >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.002)


def latency_keys(path: Path, n: int, rate: float, warm: int = 5) -> Iterator[str]:
    """The keys a latency producer sends, each when it is due: read the clock and send it.

    First `warm` warm-up keys, each once the one before has been stamped (the worker is
    up, connected and listening), then "0" .. "n-1", the i-th at start + i / rate.
    """
    for i in range(warm):
        key = f"warm{i}"
        yield key
        if not wait_key(path, key, 30.0):
            raise RuntimeError(f"warm-up job {key} did not start within 30 s")
    start = time.monotonic()
    for i in range(n):
        pause = start + i / rate - time.monotonic()
        if pause > 0:
            time.sleep(pause)
        yield str(i)
