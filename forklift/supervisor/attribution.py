"""Recording a child's death on the jobs it held, at once, or later if the database is away."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

from forklift._events import emit
from forklift._ids import application_name
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.metrics import Totals
from forklift.supervisor.child import RunningJob
from forklift.supervisor.states import JobsAction
from forklift.supervisor.store import ChargedJob, SupervisorStore

log = logging.getLogger(__name__)

# Deferred attributions are retried 1 s after the failure, then 2, 4, ... up to 30 s apart.
PENDING_RETRY = Backoff(base=1.0, factor=2.0, max=30.0, jitter=0)


@dataclass(frozen=True)
class Deferred:
    """An attribution the database was not there for."""

    owner: str
    error: str
    action: JobsAction


class Attribution:
    """Charges or releases a dead owner's jobs; keeps what failed for `retry_pending`."""

    def __init__(
        self, store: SupervisorStore, totals: Totals, retry: Backoff = PENDING_RETRY
    ) -> None:
        self.store = store
        self.totals = totals
        self.pending: list[Deferred] = []
        self._streak = Streak(retry)
        self._retry_at = 0.0

    @property
    def retry_at(self) -> float | None:
        """When the deferred attributions are tried again (None: there are none)."""
        return self._retry_at if self.pending else None

    def record(self, owner: str, error: str, action: JobsAction, now: float) -> None:
        """Attribute a death to the owner's jobs now; queue it if the database is away."""
        deferred = Deferred(owner, error, action)
        if self._apply(deferred):
            return
        if not self.pending:
            self._retry_at = now + self._streak.failed()
        self.pending.append(deferred)

    def retry_pending(self, now: float) -> None:
        """Retry the deferred attributions once due, backing off while the database stays away."""
        if not self.pending or now < self._retry_at:
            return
        self.pending = [d for d in self.pending if not self._apply(d)]
        if self.pending:
            self._retry_at = now + self._streak.failed()
        else:
            self._streak.succeeded()

    def charge_timeout(self, owner: str, job: RunningJob, reason: str) -> bool:
        """Charge one job that overran its timeout, before its child is killed.

        False if the database is away: the job is then charged on the child's death.
        """
        try:
            hits = self.store.job_fail_orphaned(
                owner, f"TimeoutError: {reason}", ids=[job.job_id], crash=False
            )
        except DatabaseError as exc:
            emit(log, "job.timeout_record_failed", logging.ERROR, job=job.job_id, error=exc)
            return False
        for hit in hits:
            self.totals.job(hit.queue, hit.task, "crashed")
            emit(
                log,
                "job.timed_out",
                logging.ERROR,
                job=hit.id,
                state=hit.state,
                attempt=hit.attempts,
                owner=owner,
            )
        return True

    def end_sessions(self, owner: str) -> None:
        """End the database sessions of a worker process killed or dead (best effort: one
        the database cannot be asked about ends by its own timeouts and keepalives)."""
        try:
            ended = self.store.backend_terminate(application_name(owner))
        except DatabaseError as exc:
            emit(log, "child.sessions_end_failed", logging.WARNING, owner=owner, error=exc)
            return
        if ended:
            emit(log, "child.sessions_ended", logging.WARNING, owner=owner, sessions=ended)

    def _apply(self, deferred: Deferred) -> bool:
        try:
            if deferred.action is JobsAction.RELEASE:
                self._release(deferred.owner, deferred.error)
            else:
                self._charge(deferred.owner, deferred.error)
        except DatabaseError as exc:
            emit(
                log,
                "child.attribution_deferred",
                logging.WARNING,
                owner=deferred.owner,
                error=exc,
            )
            return False
        return True

    def _release(self, owner: str, error: str) -> None:
        for gone in self.store.job_release_owner(owner):
            self.totals.job(gone.queue, gone.task, "released")
            emit(log, "job.released", job=gone.id, owner=owner, reason=error)

    def _charge(self, owner: str, error: str) -> None:
        count_charged(self.totals, self.store.job_fail_orphaned(owner, error), error, owner)


def count_charged(
    totals: Totals, jobs: Iterable[ChargedJob], error: str, owner: str | None = None
) -> None:
    """Count and log jobs charged for a worker that died or vanished: each ready again
    (job.failed) or out of attempts (job.dead)."""
    for job in jobs:
        totals.job(job.queue, job.task, "crashed")
        dead = job.state == "dead"
        fields: dict[str, object] = {"job": job.id, "attempt": job.attempts}
        if owner is not None:
            fields["owner"] = owner
        event = "job.quarantined" if job.quarantined else "job.dead" if dead else "job.failed"
        emit(log, event, logging.ERROR if dead else logging.WARNING, **fields, error=error)
