"""The fault tests' app: CPU work, then one effect row per run, keyed by the job's key.

The effects table has no unique constraint (see `Workload.create`), so a second commit
of one key's effect shows as a second row instead of an error. DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.
"""

from __future__ import annotations

import os
import time

import forklift

app = forklift.App()
SCHEMA = app.schema

# Short backoffs: a fault test has seconds, not minutes, for the retries of a job.
QUICK = forklift.Backoff(base=0.1, factor=2.0, max=1.0, jitter=0.0)


def spin(iterations: int) -> int:
    """CPU work that holds the GIL, as a real CPU-bound handler does."""
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return total


@app.task(name="work", max_attempts=8, backoff=QUICK)
def work(ctx: forklift.JobContext, *, key: str, spins: int = 20_000, pause: float = 0.0) -> str:
    """Work, then commit the effect with the job's completion (one row per commit); its
    result is its key."""
    spin(spins)
    if pause:
        ctx.wait_cancelled(pause)
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (key, job_id, attempt) VALUES (%s, %s, %s)",
            (key, ctx.job_id, ctx.attempt),
        )
    return key


@app.task(name="gather", max_attempts=8, backoff=QUICK)
def gather(ctx: forklift.JobContext, *, key: str) -> dict[str, object]:
    """A batch's callback: one effect row per commit, and what it saw of its batch as
    its result."""
    batch = ctx.batch
    assert batch is not None, "a callback without its batch"
    status, results = batch.status(), batch.results()
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (key, job_id, attempt) VALUES (%s, %s, %s)",
            (key, ctx.job_id, ctx.attempt),
        )
    return {
        "batch": batch.id,
        "succeeded": status.succeeded,
        "dead": status.dead,
        "pending": status.pending,
        "results": len(results),
        "keys_match": all(isinstance(v, str) and v.startswith("b-") for v in results.values()),
    }


@app.task(name="hold", max_attempts=2, backoff=QUICK)
def hold(ctx: forklift.JobContext, *, key: str, seconds: float) -> None:
    """Open the effect transaction first, then work in it for `seconds`."""
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (key, job_id, attempt) VALUES (%s, %s, %s)",
            (key, ctx.job_id, ctx.attempt),
        )
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            spin(5_000)


@app.task(name="poison", max_attempts=2, backoff=QUICK)
def poison(ctx: forklift.JobContext, *, key: str) -> None:
    """Kill the worker process every time: the job must end dead, not loop."""
    os._exit(7)
