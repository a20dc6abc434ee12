"""A fault test's app of snoozing jobs (tests/faults/test_snooze.py): each run of a job
follows the next step of its `plan` (snooze, kill its own worker, then succeed) and logs
itself to a file that outlives its process (FORKLIFT_TEST_SNOOZE_LOG), so a test reads
which runs happened, in which process and attempt, and when. DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import forklift

app = forklift.App()
LOG_ENV = "FORKLIFT_TEST_SNOOZE_LOG"

# Short backoffs: the retry after a crash runs at once.
QUICK = forklift.Backoff(base=0.1, factor=2.0, max=1.0, jitter=0.0)


@dataclass(frozen=True)
class Run:
    """One logged run: of which job key, its number among the key's runs, its step, the
    process and attempt it ran in, and when it began (seconds since the epoch)."""

    key: str
    number: int
    step: str
    pid: int
    attempt: int
    at: float


def runs(log: Path, key: str | None = None) -> list[Run]:
    """Every run logged so far (of `key`, if given), in order."""
    if not log.exists():
        return []
    found = []
    for line in log.read_text().splitlines():
        k, number, step, pid, attempt, at = line.split()
        found.append(Run(k, int(number), step, int(pid), int(attempt), float(at)))
    return [r for r in found if key is None or r.key == key]


def _log(run: Run) -> None:
    # One write of one short line in append mode: lines of several processes never mix.
    line = f"{run.key} {run.number} {run.step} {run.pid} {run.attempt} {run.at!r}\n"
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


@app.task(name="planned", max_attempts=5, max_crashes=3, backoff=QUICK)
def planned(ctx: forklift.JobContext, *, key: str, plan: list[str], seconds: float) -> str:
    """Run number n takes step plan[n] (past the plan: succeed): `snooze` (for
    `seconds`), `kill` this worker process with SIGKILL, `sleep` until killed from outside."""
    number = len(runs(Path(os.environ[LOG_ENV]), key))
    step = plan[number] if number < len(plan) else "succeed"
    _log(Run(key, number, step, os.getpid(), ctx.attempt, time.time()))
    if step == "snooze":
        raise forklift.Snooze(seconds)
    if step == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if step == "sleep":
        time.sleep(60)
    return key
