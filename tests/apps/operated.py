"""A test app for the operator tools: handlers to cancel, crash and retry. Its DSN and
schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA."""

from __future__ import annotations

import os
import time
from pathlib import Path

import forklift

app = forklift.App()
SCHEMA = app.schema


def _effect(ctx: forklift.JobContext, key: str) -> None:
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, 0)", (ctx.job_id, key)
        )


@app.task(name="stubborn", max_attempts=1)
def stubborn(ctx: forklift.JobContext, *, key: str, seconds: float = 60.0) -> None:
    """Write an effect, then work on for `seconds`, never looking at ctx.cancelled."""
    _effect(ctx, key)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.02)


@app.task(name="polite", max_attempts=1)
def polite(ctx: forklift.JobContext, *, key: str, seconds: float = 60.0) -> None:
    """Write an effect, then wait up to `seconds`, returning as soon as it is cancelled."""
    _effect(ctx, key)
    ctx.wait_cancelled(seconds)


@app.task(name="crash", max_attempts=5, max_crashes=2)
def crash(ctx: forklift.JobContext) -> None:
    """Kill the worker process every time (a segfault would do the same)."""
    os._exit(7)


@app.task(name="flaky", max_attempts=2, backoff=forklift.Backoff(base=0.05, jitter=0.0))
def flaky(ctx: forklift.JobContext, *, unless: str, dsn: str = "") -> None:
    """Fail until the file `unless` exists, then succeed (`dsn`: a secret to show safely)."""
    if not Path(unless).exists():
        raise RuntimeError(f"{unless} is not there yet")
