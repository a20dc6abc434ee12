"""A test app of async handlers for a real `forklift run` (tests/acceptance/test_async_worker.py);
DSN and schema from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA."""

from __future__ import annotations

import asyncio
import time

import forklift

app = forklift.App()


@app.task(name="block", max_attempts=1)
async def block(ctx: forklift.AsyncJobContext, *, seconds: float) -> None:
    """Block the event loop: a blocking call in an async handler (a mistake to survive)."""
    time.sleep(seconds)


@app.task(name="tick", max_attempts=1)
async def tick(
    ctx: forklift.AsyncJobContext, *, every: float, until_gap: float, most: int
) -> dict[str, float]:
    """Await timers of `every` seconds until one came `until_gap` late (or `most` of
    them); return the longest gap between two."""
    gaps, last = [0.0], time.monotonic()
    while max(gaps) < until_gap and len(gaps) <= most:
        await asyncio.sleep(every)
        now = time.monotonic()
        gaps.append(now - last)
        last = now
    return {"max_gap": round(max(gaps), 3)}


@app.task(name="nap_sync", max_attempts=1)
def nap_sync(ctx: forklift.JobContext, *, seconds: float) -> str:
    """A plain handler on an executor thread, beside the loop's."""
    time.sleep(seconds)
    return "rested"


@app.task(name="late", max_attempts=1, timeout=1.0)
async def late(ctx: forklift.AsyncJobContext, *, blocking: bool) -> None:
    """Run past its 1 s timeout: awaiting (the loop cancels it) or blocking the loop
    (only the supervisor's kill ends it)."""
    if blocking:
        time.sleep(8)
    else:
        await asyncio.sleep(30)


@app.task(name="bystander", max_attempts=1)
async def bystander(ctx: forklift.AsyncJobContext, *, seconds: float) -> str:
    await asyncio.sleep(seconds)
    return "done"
