"""A worker's connections: one for its own statements, a lazy pool for handlers' effects,
both shaped by whether the database URL leads through a pooler (PgBouncer)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from forklift import _db
from forklift._events import emit
from forklift._refused import refusal
from forklift._service import Repeats
from forklift.errors import DatabaseError
from forklift.store import EffectBudget, JobStore

log = logging.getLogger(__name__)


class AsyncEffects:
    """The pool async handlers' effect transactions take their AsyncConnections from:
    made and opened on the worker's event loop when the first one opens a transaction
    (a worker of sync handlers never has one), closed there at the stop (aio.py)."""

    def __init__(
        self, dsn: str, timeouts: _db.Timeouts, application_name: str, budget: EffectBudget
    ) -> None:
        self.dsn = dsn
        self.timeouts = timeouts
        self.application_name = application_name
        self.budget = budget
        self._pool: _db.LiveAsyncPool | None = None
        self._lock: asyncio.Lock | None = None

    async def pool(self) -> _db.LiveAsyncPool:
        if self._pool is not None:
            return self._pool
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._pool is None:
                pool = _db.make_async_pool(
                    self.dsn, self.timeouts, max_size=self.budget.size,
                    name=f"async-effects-{os.getpid()}", application_name=self.application_name,
                )  # fmt: skip
                await pool.open(wait=False)
                self._pool = pool
        return self._pool

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close(timeout=2.0)


@dataclass(frozen=True)
class WorkerConnections:
    """The worker's own connection (claims, renewals, completions: one per worker, so
    `--workers N` holds N + 2 while handlers do not use ctx.transaction()) and the pools
    its handlers' effect transactions take theirs from, opened lazily, so the worker's
    statements never wait behind a handler: a sync pool and an async one (async
    handlers), at most --pool connections between them (`EffectBudget`)."""

    own: _db.LivePool
    effects: _db.LivePool
    async_effects: AsyncEffects

    @classmethod
    def open(
        cls, dsn: str, timeouts: _db.Timeouts, application_name: str, effects: int
    ) -> WorkerConnections:
        pid = os.getpid()
        own = _db.make_pool(
            dsn, timeouts, max_size=1, name=f"worker-{pid}", application_name=application_name
        )
        pool = _db.make_pool(
            dsn, timeouts, max_size=effects, min_size=0, name=f"effects-{pid}",
            application_name=application_name, own=False,
        )  # fmt: skip
        own.open(wait=False)
        pool.open(wait=False)
        budget = EffectBudget(effects, timeout=timeouts.connect * 2)
        return cls(own, pool, AsyncEffects(dsn, timeouts, application_name, budget))

    def store(self, schema: str) -> JobStore:
        return JobStore(self.own, schema, effects=self.effects, async_effects=self.async_effects)

    def close(self) -> None:
        self.own.close(timeout=2.0)
        self.effects.close(timeout=2.0)


def detect_pooler(
    dsn: str, timeouts: _db.Timeouts, stopping: Callable[[], bool], wait: Callable[[float], object]
) -> None:
    """Find out whether `dsn` leads through a pooler: its connections then set their
    bounds per transaction and prepare no statements. Asked until the database answers
    (or `stopping()`; `wait` sleeps, woken by a stop), since the pools' connections
    depend on the answer."""
    repeats = Repeats()
    while not stopping():
        try:
            _db.detect_pooler(dsn, timeouts)
            return
        except DatabaseError as exc:
            if repeats.worth_logging(exc):
                refused = refusal(exc)  # no retry fixes it: said as an error, with its cause
                if refused is not None:
                    emit(log, "worker.database_refuses", logging.ERROR, error=refused)
                else:
                    emit(log, "worker.database_unreachable", logging.WARNING, error=exc)
            wait(0.5)
