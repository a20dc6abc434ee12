"""The forklift app of bench.compare: bench.apps' tasks plus "stamp" and "asleep".

Workers load it as `bench.compare_app:app` (DSN and schema from FORKLIFT_DATABASE_URL and
FORKLIFT_SCHEMA, the repository root on PYTHONPATH); the benchmark's producer adds the
same "stamp" task to its own App with `register_stamp()`.
"""

from __future__ import annotations

import asyncio

import forklift
from bench import _stamps, apps


def register_stamp(app: forklift.App) -> forklift.App:
    """Register "stamp" on `app`: the latency task of every contender (see bench._stamps)."""

    @app.task(name="stamp")
    def stamp(ctx: forklift.JobContext, key: str, t: float) -> None:
        """Record the handler's start, first thing, against the producer's clock reading."""
        _stamps.stamp(key, t)

    return app


def register_asleep(app: forklift.App) -> forklift.App:
    """Register "asleep" on `app`: an I/O-bound async job (bench.async_jobs)."""

    @app.task(name="asleep")
    async def asleep(ctx: forklift.AsyncJobContext, seconds: float) -> None:
        """Await `seconds` on the worker's event loop, as an HTTP call would."""
        await asyncio.sleep(seconds)

    return app


app = register_asleep(register_stamp(apps.register(forklift.App())))
