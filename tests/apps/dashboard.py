"""A test app for the dashboard: a job that dies on its only attempt, with a traceback.
Its DSN and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA."""

from __future__ import annotations

import forklift

app = forklift.App()


@app.task(name="doomed", queue="doomed", max_attempts=1)
def doomed(ctx: forklift.JobContext, *, why: str) -> None:
    """Fail at once: the job goes dead on its first attempt."""
    raise RuntimeError(f"doomed on purpose: {why}")
