"""A test app with two one-second schedules: one with the default misfire policy, one
that catches up every missed fire time within a minute."""

from __future__ import annotations

from datetime import timedelta

import forklift

app = forklift.App()


@app.periodic(every=timedelta(seconds=1), name="tick")
def tick(ctx: forklift.JobContext) -> None:
    pass


@app.periodic(every=timedelta(seconds=1), name="tick-catchup", catchup=timedelta(minutes=1))
def tick_catchup(ctx: forklift.JobContext) -> None:
    pass
