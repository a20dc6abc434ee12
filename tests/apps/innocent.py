"""A test app for faults that must charge only the job at fault: crashes, segfaults,
timeouts under a limit, handlers that leave subprocesses behind."""

from __future__ import annotations

import ctypes
import os
import subprocess
import time

import forklift
from forklift.testing import process_state

app = forklift.App()


@app.task(name="noop")
def noop(ctx: forklift.JobContext) -> None:
    pass


@app.task(name="exit", max_attempts=3)
def exit_process(ctx: forklift.JobContext, *, code: int = 7) -> None:
    os._exit(code)


@app.task(name="segfault", max_attempts=2)
def segfault(ctx: forklift.JobContext) -> None:
    """Read address 0 in native code: SIGSEGV, no Python exception."""
    ctypes.string_at(0)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie does not: it is only waiting to be reaped)."""
    return process_state(pid) not in (None, "Z")


@app.task(
    name="overrun",
    timeout=1.0,
    max_attempts=2,
    limit=forklift.Limit(concurrency=1, key="key"),
)
def overrun(ctx: forklift.JobContext, *, key: str, marks: str, spin: float) -> None:
    """Append "start <token> <pid> <overlap>" to `marks`, overlap 1 when an earlier
    start there has no end and its process still runs (two handlers of the key at once);
    then, on a first attempt, spin `spin` seconds ignoring everything (only a kill ends
    it); a later attempt appends "end <token>" and returns."""
    token = f"{ctx.job_id}.{ctx.attempt}"
    with open(marks, "a+") as f:
        f.seek(0)
        started: dict[str, int] = {}
        for line in f:
            word = line.split()
            if word[0] == "start":
                started[word[1]] = int(word[2])
            else:
                started.pop(word[1], None)
        overlap = any(_alive(pid) for pid in started.values())
        f.write(f"start {token} {os.getpid()} {int(overlap)}\n")
    if ctx.attempt == 1:
        deadline = time.monotonic() + spin
        while time.monotonic() < deadline:
            sum(range(1000))
    with open(marks, "a") as f:
        f.write(f"end {token}\n")


@app.task(name="spawn_and_die", max_attempts=1)
def spawn_and_die(ctx: forklift.JobContext, *, pidfile: str) -> None:
    """Start a long subprocess (as a handler running an external tool does), note its
    pid, then die with the worker."""
    child = subprocess.Popen(["sleep", "600"])
    with open(pidfile, "w") as f:
        f.write(str(child.pid))
    os._exit(9)
