"""The app of bench.labels: a no-op three times over, differing only in the labels a worker
must have to run it (`requires=`): none, {"gpu"}, and {"model-x"}.

Workers load it as `bench.labels_app:app`; the DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, and the repository root must be on PYTHONPATH.
The bench registers the same tasks on its own producer App with `register()`, so that its
enqueues store each job's labels (jobs.requires) as a real producer's do.
"""

from __future__ import annotations

import forklift

PLAIN_NOOP = "plain_noop"
GPU_NOOP = "gpu_noop"
MODEL_NOOP = "model_noop"
GPU = "gpu"
MODEL = "model-x"


def register(app: forklift.App) -> forklift.App:
    """Register the bench's three tasks on `app`; return it."""

    @app.task(name=PLAIN_NOOP)
    def plain_noop(ctx: forklift.JobContext) -> None:
        """Do nothing; any worker may."""

    @app.task(name=GPU_NOOP, requires={GPU})
    def gpu_noop(ctx: forklift.JobContext) -> None:
        """Do nothing, on a worker started with --labels gpu."""

    @app.task(name=MODEL_NOOP, requires={MODEL})
    def model_noop(ctx: forklift.JobContext) -> None:
        """Do nothing, on a worker started with --labels model-x."""

    return app


app = register(forklift.App())
