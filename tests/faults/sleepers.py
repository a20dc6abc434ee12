"""A fault test's app whose handlers each log when they start and when they end, to a
file that outlives the database (FORKLIFT_TEST_RUNS_LOG): so a test counts the handlers
of one job that ran at once, even across an outage. DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.
"""

from __future__ import annotations

import itertools
import os
import time
from dataclasses import dataclass
from pathlib import Path

import forklift

app = forklift.App()
LOG_ENV = "FORKLIFT_TEST_RUNS_LOG"


def _log(line: str) -> None:
    # One write of one short line in append mode: lines of several processes never mix.
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{line}\n".encode())
    finally:
        os.close(fd)


@app.task(name="sleeper", max_attempts=3)
def sleeper(ctx: forklift.JobContext, *, key: str, seconds: float) -> None:
    """Sleep through anything (a handler busy in a C call, deaf to ctx.cancelled): it
    runs its `seconds` whatever happens to its lease or the database meanwhile."""
    _log(f"start {key} {ctx.attempt} {time.time():.6f}")
    time.sleep(seconds)
    _log(f"end {key} {ctx.attempt} {time.time():.6f}")


@dataclass(frozen=True)
class Run:
    key: str
    attempt: int
    started: float
    ended: float | None  # None: not ended (yet, or its worker died)


def runs(log: Path) -> list[Run]:
    """Every handler run the log shows."""
    starts: dict[tuple[str, int], float] = {}
    ends: dict[tuple[str, int], float] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            what, key, attempt, at = line.split()
            (starts if what == "start" else ends)[(key, int(attempt))] = float(at)
    return [Run(k, a, t, ends.get((k, a))) for (k, a), t in sorted(starts.items())]


def overlapping(found: list[Run]) -> list[str]:
    """The keys of which two handlers ran at once (a run not ended runs still)."""
    by_key: dict[str, list[Run]] = {}
    for run in found:
        by_key.setdefault(run.key, []).append(run)
    doubled = []
    for key, of_key in sorted(by_key.items()):
        spans = sorted((r.started, float("inf") if r.ended is None else r.ended) for r in of_key)
        if any(later[0] < earlier[1] for earlier, later in itertools.pairwise(spans)):
            doubled.append(key)
    return doubled
