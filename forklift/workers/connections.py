"""A worker's connections: one for its own statements, a lazy pool for handlers' effects,
both shaped by whether the database URL leads through a pooler (PgBouncer)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass

from forklift import _db
from forklift._events import emit
from forklift._service import Repeats
from forklift.errors import DatabaseError
from forklift.store import JobStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class WorkerConnections:
    """The worker's own connection (claims, renewals, completions: DESIGN invariant 18)
    and the pool its handlers' effect transactions take theirs from, opened lazily, so
    the worker's statements never wait behind a handler."""

    own: _db.LivePool
    effects: _db.LivePool

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
            application_name=application_name,
        )  # fmt: skip
        own.open(wait=False)
        pool.open(wait=False)
        return cls(own, pool)

    def store(self, schema: str) -> JobStore:
        return JobStore(self.own, schema, effects=self.effects)

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
                emit(log, "worker.database_unreachable", logging.WARNING, error=exc)
            wait(0.5)
