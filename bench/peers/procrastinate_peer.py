"""procrastinate's app and producer for bench.compare (the peers venv only).

Workers: `python -m procrastinate --app bench.peers.procrastinate_peer.app worker
--concurrency C`, one process each (procrastinate has no process supervisor). The app
uses the `PsycopgConnector` (async psycopg 3 pool) its docs recommend. The no-op, stamp,
nap and asleep tasks are async, run on the worker's event loop, `concurrency` at once; the CPU
task is sync, which procrastinate runs in a thread. The producer: `Task.batch_defer_async`,
its batch path (one statement for the batch), and `Task.defer_async` for one job.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import procrastinate

from bench.peers import _work

app = procrastinate.App(
    connector=procrastinate.PsycopgConnector(conninfo=os.environ.get("BENCH_DSN", ""))
)


@app.task(name="noop")
async def noop() -> None:
    pass


@app.task(name="stamp")
async def stamp(key: str, t: float) -> None:
    _work.started(key, t)


@app.task(name="burn")
def burn(iterations: int) -> None:
    _work.spin(iterations)


@app.task(name="asleep")
async def asleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@app.task(name="nap")
async def nap(seconds: float) -> None:
    _work.started("nap")
    await asyncio.sleep(seconds)


class Producer:
    async def open(self) -> None:
        await app.open_async()

    async def close(self) -> None:
        await app.close_async()

    async def install(self) -> None:
        await app.schema_manager.apply_schema_async()

    async def reset(self) -> None:
        await app.connector.execute_query_async(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers "
            "RESTART IDENTITY CASCADE"
        )

    async def uninstall(self) -> None:
        pass  # its tables go with the run's database

    async def enqueue(self, task: str, kwargs: dict[str, Any]) -> None:
        await app.tasks[task].defer_async(**kwargs)

    async def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> None:
        await app.tasks[task].batch_defer_async(*kwargs)
