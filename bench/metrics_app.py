"""The app of bench.metrics: 50 no-op tasks, task00 .. task49, on the "default" queue.

Workers load it as `bench.metrics_app:app`; the DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, and the repository root must be on
PYTHONPATH. Each handler does nothing, except that a job enqueued with `fail=N` raises
in its first N attempts: with max_attempts=1 it goes dead, with more attempts it is
retried (outcome "failed") and then succeeds or dies. So every task can be given
several outcomes, and the supervisor's /metrics many series. Retries come after ~50 ms
(a short backoff), so the benchmark does not wait for the default backoff.
"""

from __future__ import annotations

from collections.abc import Callable

import forklift
from forklift.backoff import Backoff

TASKS = tuple(f"task{i:02d}" for i in range(50))
RETRY = Backoff(base=0.05, factor=1.0, max=0.05, jitter=0.2)


class PlannedFailure(Exception):
    """The failure a job asked for with `fail=N`."""


def _make(name: str) -> Callable[..., None]:
    def handler(ctx: forklift.JobContext, fail: int = 0) -> None:
        """Do nothing, or raise `PlannedFailure` in the first `fail` attempts."""
        if ctx.attempt <= fail:
            raise PlannedFailure(f"{name}: attempt {ctx.attempt} fails as asked")

    handler.__name__ = handler.__qualname__ = name
    return handler


def register(app: forklift.App) -> forklift.App:
    """Register task00 .. task49 on `app`; return it."""
    for name in TASKS:
        app.task(name=name, backoff=RETRY)(_make(name))
    return app


app = register(forklift.App())
