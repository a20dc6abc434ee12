"""The benchmark's app: DSN and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.

Workers load it as `bench.apps:app`, so the repository root must be on PYTHONPATH. The
benchmark's producer registers the same tasks on its own App with `register()`, so its
enqueue calls validate arguments the way a real producer's do.
"""

from __future__ import annotations

import time

import forklift


def register(app: forklift.App) -> forklift.App:
    """Register the benchmark's tasks on `app`; return it."""

    @app.task(name="noop")
    def noop(ctx: forklift.JobContext) -> None:
        """Do nothing: measures forklift's own overhead per job."""

    @app.task(name="latency")
    def latency(ctx: forklift.JobContext) -> None:
        """Record when the handler started, on the database clock, in the effect transaction.

        The table `<schema>.latency(job_id, started_at)` is created by the benchmark.
        """
        with ctx.transaction() as conn:
            conn.execute(
                f'INSERT INTO "{app.schema}".latency (job_id, started_at) '
                "VALUES (%s, clock_timestamp())",
                (ctx.job_id,),
            )

    @app.task(name="nap")
    def nap(ctx: forklift.JobContext, *, seconds: float) -> str:
        """Sleep `seconds`, then return a small result (bench/batch.py's result latency)."""
        time.sleep(seconds)
        return "rested"

    return app


app = register(forklift.App())
