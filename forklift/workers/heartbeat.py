"""Lease renewal: one statement renews every held lease; a lease found gone is lost."""

from __future__ import annotations

import logging

from forklift._events import emit
from forklift.errors import ForkliftError
from forklift.workers.parts import WorkerParts

log = logging.getLogger(__name__)


class HeartbeatMixin(WorkerParts):
    """The heartbeat thread of a Worker: renews leases every third of the lease."""

    def _heartbeat_loop(self) -> None:
        while not self._closing.wait(self.config.heartbeat_interval):
            try:
                self.renew_once()
            except ForkliftError as exc:
                emit(log, "lease.renew_failed", logging.WARNING, error=exc)

    def renew_once(self) -> int:
        """Renew every held lease in one statement; mark the ones found gone as lost."""
        with self._flush_lock:
            held = [c for c in self._held_snapshot() if not c.finished]
            if not held:
                return 0
            kept = self.store.lease_renew_many(
                [(c.job_id, c.attempt) for c in held], self.owner, self.config.lease
            )
        if self.tally is not None:
            self.tally.renewed(len(kept))
        for ctx in held:
            if ctx.job_id in kept:
                continue
            with ctx.outcome_lock:
                if ctx.finished:
                    continue
                ctx.lease_lost = True
                ctx.cancelled.set()
            self._job_event("job.lease_lost", ctx, logging.WARNING, effect="handler told to stop")
        return len(kept)
