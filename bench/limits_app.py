"""The forklift apps of bench.limits: one no-op task "tick", unlimited or under a Limit.

Workers load one of them as `bench.limits_app:<name>` (a name of APPS; DSN and schema
from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, the repository root on PYTHONPATH). Each
app holds "tick" alone: a worker whose app declares any limit makes every claim the
limited one, so the unlimited baseline must be an app with none. The benchmark's
producer registers the same task with the same limit on its own App (`register`), so
its enqueue computes the jobs' limit key as a real producer's does.
"""

from __future__ import annotations

import forklift
from forklift import Limit

RATE = 500  # starts per second of the "rated" app's limit

# The apps by name: what limit "tick" runs under in each.
LIMITS: dict[str, Limit | None] = {
    "unlimited": None,
    "roomy": Limit(concurrency=10_000),  # configured, never binding with 2 workers
    "per_key": Limit(concurrency=1, key="k"),
    "rated": Limit(rate=RATE, per=1.0),
}


def register(app: forklift.App, limit: Limit | None) -> forklift.App:
    """Register "tick" under `limit` on `app`; return it."""

    @app.task(name="tick", limit=limit)
    def tick(ctx: forklift.JobContext, *, k: int = 0) -> None:
        """Do nothing: `k` is the key of the per-key limit (the others ignore it)."""

    return app


unlimited = register(forklift.App(), LIMITS["unlimited"])
roomy = register(forklift.App(), LIMITS["roomy"])
per_key = register(forklift.App(), LIMITS["per_key"])
rated = register(forklift.App(), LIMITS["rated"])
APPS = ("unlimited", "roomy", "per_key", "rated")
