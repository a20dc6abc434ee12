"""The app of bench.cpu, bench.restart and bench.memory (tasks "burn" and "nap").

Workers load it as `bench.cpu_app:app`; the DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, and the repository root must be on
PYTHONPATH. The benchmarks register the same tasks on their own producer App with
`register()`, so their enqueue calls validate arguments as a real producer's do, and
call `spin()` directly to calibrate and to run the in-process comparison.
"""

from __future__ import annotations

import os
import time

import forklift


def spin(iterations: int) -> int:
    """Pure-Python CPU work: `iterations` rounds of integer arithmetic, GIL held throughout."""
    total = 0
    for i in range(iterations):
        total = (total + i * i) % 1_000_003
    return total


def timed_spin(iterations: int) -> tuple[float, float]:
    """`spin(iterations)`; when it began and ended (time.time()): the Pool's handler, timed
    as the workers' "burn" times its own."""
    began = time.time()
    spin(iterations)
    return began, time.time()


def register(app: forklift.App) -> forklift.App:
    """Register the benchmark tasks on `app`; return it."""

    @app.task(name="burn")
    def burn(ctx: forklift.JobContext, iterations: int) -> dict[str, float]:
        """CPU-bound job: `spin(iterations)` (the benchmark calibrates it to ~50 ms).

        Its result is the worker's pid and when the spin began and ended (time.time()):
        bench.cpu counts the jobs each worker ran and times the gaps between them."""
        began = time.time()
        spin(iterations)
        return {"pid": os.getpid(), "began": began, "ended": time.time()}

    @app.task(name="nap")
    def nap(ctx: forklift.JobContext, seconds: float = 5.0) -> None:
        """Sleep `seconds`, checking ctx.cancelled every 10 ms (stops early when told)."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline and not ctx.cancelled:
            time.sleep(0.01)

    return app


app = register(forklift.App())
