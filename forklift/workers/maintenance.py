"""Maintenance: rescue exhausted expired leases and prune old jobs, one replica at a time."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import NamedTuple

from forklift import _db
from forklift._events import emit
from forklift._service import Repeats, TestSignal
from forklift._singleton import singleton
from forklift.errors import DatabaseError
from forklift.store import JobStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenanceConfig:
    """How often maintenance runs, and how long finished jobs are kept."""

    interval: float = 10.0
    keep_finished: float = 86400.0  # succeeded and cancelled jobs
    keep_dead: float = 7 * 86400.0


class Maintained(NamedTuple):
    """What one round did: jobs rescued to dead, finished jobs pruned."""

    rescued: int
    pruned: int


class Maintenance:
    """Dead-letters expired leases with no attempts left, and prunes finished jobs past
    their retention. A singleton section: across every replica one worker at a time."""

    def __init__(
        self,
        store: JobStore,
        dsn: str,
        timeouts: _db.Timeouts,
        config: MaintenanceConfig | None = None,
    ) -> None:
        self.store = store
        self.dsn = dsn
        self.timeouts = timeouts
        self.config = config or MaintenanceConfig()
        self.ran: TestSignal[Maintained | None] = TestSignal()
        self._section = f"maintenance:{store.schema}"
        self._repeats = Repeats()
        self._next = time.monotonic()

    def run_due(self) -> None:
        """Run a round if the interval has passed since the last one; a failure is logged.

        For the claim loop, between claims.
        """
        if time.monotonic() < self._next:
            return
        try:
            self.run_once()
        except DatabaseError as exc:
            if self._repeats.worth_logging(exc):
                emit(log, "maintenance.failed", logging.WARNING, error=exc)
        else:
            self._repeats.clear()
        self._next = time.monotonic() + self.config.interval

    def run_once(self) -> Maintained | None:
        """One round: (rescued, pruned), or None when another replica holds the section."""
        with singleton(self.dsn, self.timeouts, self._section) as mine:
            if not mine:
                self.ran.emit(None)
                return None
            rescued = self.store.job_rescue_exhausted()
            pruned = self.store.job_prune(self.config.keep_finished, self.config.keep_dead)
        for job_id in rescued:
            emit(
                log, "job.dead", logging.ERROR, job=job_id, error="lease expired, no attempts left"
            )
        result = Maintained(len(rescued), pruned)
        self.ran.emit(result)
        return result
