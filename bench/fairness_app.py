"""The app of bench.fairness: a short sleep and a no-op, each as a fair task and a plain one.

Workers load it as `bench.fairness_app:app`; the DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, and the repository root must be on PYTHONPATH.
The bench registers the same tasks on its own producer App with `register()`, so that its
enqueues store each fair job's key as a real producer's do. The fair tasks and the plain
ones differ in `fair=` alone: what the bench compares is that declaration.

The sleeping tasks return `time.time()` as their handler starts (the database runs on
this host: its clock is this one), so the bench can check that a job's claim
(`started_at`) is when its handler started, not a claim ahead of a free slot.
"""

from __future__ import annotations

import time

import forklift

FAIR_NAP = "fair_nap"
PLAIN_NAP = "plain_nap"
FAIR_NOOP = "fair_noop"
PLAIN_NOOP = "plain_noop"


def register(app: forklift.App) -> forklift.App:
    """Register the bench's four tasks on `app`; return it."""

    @app.task(name=FAIR_NAP, fair="account")
    def fair_nap(ctx: forklift.JobContext, *, account: str, seconds: float) -> float:
        """Sleep `seconds` in turns across accounts; when the handler started."""
        return nap(seconds)

    @app.task(name=PLAIN_NAP)
    def plain_nap(ctx: forklift.JobContext, *, account: str, seconds: float) -> float:
        """Sleep `seconds` in due order (first in, first out); when the handler started."""
        return nap(seconds)

    @app.task(name=FAIR_NOOP, fair="account")
    def fair_noop(ctx: forklift.JobContext, *, account: str) -> None:
        """Do nothing, in turns across accounts."""

    @app.task(name=PLAIN_NOOP)
    def plain_noop(ctx: forklift.JobContext, *, account: str = "") -> None:
        """Do nothing, in due order."""

    return app


def nap(seconds: float) -> float:
    """Sleep `seconds` (a job of known length: the capacity is workers / seconds);
    return when the sleep began (time.time())."""
    began = time.time()
    time.sleep(seconds)
    return began


app = register(forklift.App())
