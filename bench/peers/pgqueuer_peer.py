"""pgqueuer's app and producer for bench.compare (the peers venv only).

Workers: `python -m bench.peers pgqueuer work [--batch-size N] [--max-concurrent-tasks
M]`, which is `pgq run bench.peers.pgqueuer_peer:create_pgqueuer [...]` through
`pgqueuer.run`, the programmatic form of `pgq run` (same supervisor, same uvloop): the
`pgq run` command of pgqueuer 1.6.0 fails at start with this typer (its --log-level
parser hands a str where an enum is expected). The factory is the one pgqueuer's CLI docs
show: one asyncpg connection per process, the driver its docs measure fastest.
Entrypoints must be async in pgqueuer 1.6; the CPU task runs `spin` through
asyncio.to_thread, as the error message of pgqueuer's executor recommends for blocking
work. The producer: `Queries.enqueue` with lists, its batch insert (one
statement), or with scalars for one job.

For bench.limits, `work --keys N --key-limit C` also registers the no-op entrypoints
`k0` .. `k{N-1}`, each with `concurrency_limit=C` (0: unlimited): pgqueuer 1.6 has no
per-key limit, so one entrypoint per key stands in for it; `enqueue-keys` fills them
in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import asyncpg
import pgqueuer
from pgqueuer import PgQueuer
from pgqueuer.adapters.cli.cli import asyncio_run
from pgqueuer.core import logconfig
from pgqueuer.models import Job
from pgqueuer.queries import Queries

from bench.peers import _work

# The key entrypoints the workers of this process register: (count, concurrency_limit).
KEYS = (0, 0)


def kwargs_of(job: Job) -> Any:
    return json.loads(job.payload) if job.payload else {}


def register(pgq: PgQueuer) -> None:
    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        pass

    @pgq.entrypoint("stamp")
    async def stamp(job: Job) -> None:
        kw = kwargs_of(job)
        _work.started(kw["key"], kw["t"])

    @pgq.entrypoint("burn")
    async def burn(job: Job) -> None:
        await asyncio.to_thread(_work.spin, kwargs_of(job)["iterations"])

    @pgq.entrypoint("asleep")
    async def asleep(job: Job) -> None:
        await asyncio.sleep(kwargs_of(job)["seconds"])

    @pgq.entrypoint("nap")
    async def nap(job: Job) -> None:
        _work.started("nap")
        await asyncio.sleep(kwargs_of(job)["seconds"])

    keys, limit = KEYS
    for key in range(keys):

        @pgq.entrypoint(f"k{key}", concurrency_limit=limit)
        async def tick(job: Job) -> None:
            pass


@contextlib.asynccontextmanager
async def create_pgqueuer() -> AsyncIterator[PgQueuer]:
    """The factory `pgq run` calls in each worker process."""
    connection = await asyncpg.connect(dsn=os.environ["BENCH_DSN"])
    pgq = PgQueuer.from_asyncpg_connection(connection)
    register(pgq)
    try:
        yield pgq
    finally:
        await connection.close()


class Producer:
    def __init__(self) -> None:
        self.connection: asyncpg.Connection | None = None
        self.queries: Queries | None = None

    async def open(self) -> None:
        self.connection = await asyncpg.connect(dsn=os.environ["BENCH_DSN"])
        self.queries = Queries.from_asyncpg_connection(self.connection)

    async def close(self) -> None:
        if self.connection is not None:
            await self.connection.close()

    async def install(self) -> None:
        assert self.queries is not None
        await self.queries.install()

    async def reset(self) -> None:
        assert self.connection is not None
        await self.connection.execute(
            "TRUNCATE pgqueuer, pgqueuer_log, pgqueuer_statistics RESTART IDENTITY"
        )

    async def uninstall(self) -> None:
        pass  # its tables go with the run's database

    async def enqueue(self, task: str, kwargs: dict[str, Any]) -> None:
        assert self.queries is not None
        await self.queries.enqueue(task, json.dumps(kwargs).encode())

    async def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> None:
        assert self.queries is not None
        payloads: list[bytes | None] = [json.dumps(k).encode() for k in kwargs]
        await self.queries.enqueue([task] * len(kwargs), payloads, [0] * len(kwargs))

    async def enqueue_keys(
        self, prefix: str, keys: int, first: int, kwargs: list[dict[str, Any]]
    ) -> None:
        """One job per item of `kwargs`, to entrypoints PREFIX0 .. PREFIX{keys-1} in turn,
        the turn of the first being `first` (so batches carry on where the last stopped)."""
        assert self.queries is not None
        names = [f"{prefix}{(first + i) % keys}" for i in range(len(kwargs))]
        payloads: list[bytes | None] = [json.dumps(k).encode() for k in kwargs]
        await self.queries.enqueue(names, payloads, [0] * len(kwargs))


def work(argv: list[str]) -> None:
    """A worker process, as `pgq run` starts it (its options, its event loop)."""
    p = argparse.ArgumentParser(prog="python -m bench.peers pgqueuer work")
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--heartbeat-timeout", type=float, default=30.0)
    p.add_argument(
        "--max-concurrent-tasks", type=int, default=0, help="jobs at once (0: unlimited)"
    )
    p.add_argument("--keys", type=int, default=0, help="entrypoints k0.. to register too")
    p.add_argument("--key-limit", type=int, default=0, help="their concurrency_limit")
    args = p.parse_args(argv)
    global KEYS
    KEYS = (args.keys, args.key_limit)
    logconfig.setup_fancy_logger(logconfig.LogLevel.WARNING)
    asyncio_run(
        pgqueuer.run(
            create_pgqueuer,
            batch_size=args.batch_size,
            heartbeat_timeout=timedelta(seconds=args.heartbeat_timeout),
            max_concurrent_tasks=args.max_concurrent_tasks or None,
        )
    )
