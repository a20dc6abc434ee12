"""Maintenance: rescue exhausted expired leases and prune old jobs, one replica at a time."""

from __future__ import annotations

import logging

from forklift._events import emit
from forklift._singleton import singleton
from forklift.errors import DatabaseError
from forklift.workers.parts import WorkerParts

log = logging.getLogger(__name__)


class MaintenanceMixin(WorkerParts):
    """run_once()-style maintenance for a Worker's claim loop."""

    def maintain_once(self) -> tuple[int, int] | None:
        """Dead-letter exhausted expired leases and prune old finished jobs.

        A singleton section: across all replicas one worker at a time does it; the
        others return None at once. Returns (rescued, pruned) otherwise.
        """
        section = f"maintenance:{self.app.schema}"
        try:
            with singleton(self.app.dsn, self._timeouts, section) as mine:
                if not mine:
                    return None
                rescued = self.store.job_rescue_exhausted()
                pruned = self.store.job_prune(self.config.keep_finished, self.config.keep_dead)
        except DatabaseError as exc:
            emit(log, "maintenance.failed", logging.WARNING, error=exc)
            return 0, 0
        for job_id in rescued:
            emit(
                log, "job.dead", logging.ERROR, job=job_id, error="lease expired, no attempts left"
            )
        return len(rescued), pruned
