"""A test app whose scheduled jobs fail: one on its first attempt only, one always."""

from __future__ import annotations

from datetime import timedelta

import forklift

app = forklift.App()
QUICK = forklift.Backoff(base=0.2, jitter=0.0)


@app.periodic(every=timedelta(seconds=2), name="flaky", backoff=QUICK)
def flaky(ctx: forklift.JobContext) -> None:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")


@app.periodic(every=timedelta(seconds=2), name="doomed", max_attempts=2, backoff=QUICK)
def doomed(ctx: forklift.JobContext) -> None:
    raise RuntimeError("doomed to fail")
