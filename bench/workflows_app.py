"""The app of bench.workflows: one no-op task, "step", for every job of its graphs.

Workers load it as `bench.workflows_app:app`; the DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, and the repository root must be on PYTHONPATH.
The bench registers the same task on its own producer App with `register()`, so that
`wf.add` and `enqueue_many` check their arguments as a real producer's do. The step
reads neither ctx.upstream nor ctx.workflow (both are read on first use only): what is
measured is forklift's cost per job, the graph's included.
"""

from __future__ import annotations

import forklift


def register(app: forklift.App) -> forklift.App:
    """Register the bench's task on `app`; return it."""

    @app.task(name="step")
    def step(ctx: forklift.JobContext, *, n: int = 0) -> None:
        """Do nothing (`n` tells the steps of a graph apart in their arguments)."""

    return app


app = register(forklift.App())
