"""A test app with a one-second schedule and a task that sleeps: what the parent must keep
doing on time (fire schedules, charge deaths) whatever else it is busy with."""

from __future__ import annotations

from datetime import timedelta

import forklift

app = forklift.App()


@app.periodic(every=timedelta(seconds=1), name="tick")
def tick(ctx: forklift.JobContext) -> None:
    pass


@app.task(name="sleep")
def sleep(ctx: forklift.JobContext, *, seconds: float) -> None:
    """Sleep, waking at once when told to stop."""
    ctx.wait_cancelled(seconds)
