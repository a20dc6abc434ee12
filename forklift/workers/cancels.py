"""Operators' cancels of the jobs this worker runs: hinted on the control channel and
confirmed in the database, or found by the lease renewer when the notification was missed.

`forklift jobs cancel` has already taken the job's lease by then (it is `cancelled` in
the database, and the owner fence refuses anything this worker records for it); here
the handler is told to stop (`ctx.cancelled`), the job's end is logged as a cancel
rather than a lost lease, and `on_cancel` tells the supervisor, which kills this process
if the handler has not returned within its --cancel-grace.

Until the handler has stopped, the job keeps its limits' slots (a limit is never
exceeded, not even briefly):
the cancel moved its lease to a hold (`stopping_owner`, migration 0013), which the lease
renewer's rounds extend here (`among_lost`: a cancelled job's lease is found gone each
round) and `stopped` ends once the job's outcome is refused, its handler done. A death
of this process ends its holds at its supervisor (Attribution); a lost host's lapse.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from forklift._events import emit
from forklift.errors import DatabaseError
from forklift.store import ClaimedJob, JobStore
from forklift.store.limits import LimitStore
from forklift.workers.context import JobContext, Stage
from forklift.workers.events import JobEvents
from forklift.workers.holdings import Holdings

log = logging.getLogger(__name__)


def parse_order(payload: str) -> tuple[int, int] | None:
    """(job id, attempt) of a `cancel <id> <attempt>` order; None for anything else."""
    kind, _, rest = payload.partition(" ")
    parts = rest.split(" ")
    if kind != "cancel" or len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


class Cancels:
    """Tells a held job's handler to stop, once, when an operator cancelled the job."""

    def __init__(
        self,
        store: JobStore,
        holdings: Holdings,
        events: JobEvents,
        on_cancel: Callable[[ClaimedJob], None] | None = None,
        *,
        lease: float = 30.0,
    ) -> None:
        self.store = store
        self.holdings = holdings
        self.events = events
        self.on_cancel = on_cancel
        self.lease = lease  # a hold is extended this long, as a lease is
        self.holds = LimitStore(store.pool, store.schema, store.where)
        self._lock = threading.Lock()
        self._stopped: list[JobContext] = []  # cancelled jobs whose holds are to end
        self._letting_go = False  # a thread ends them now

    def notice(self, payload: str) -> bool:
        """A control-channel notification; True if it cancelled a job held here.

        Only a hint: NOTIFY needs no privilege, so any role that can log in could send
        one. The job is stopped only if the database says it was cancelled (its lease
        taken by `forklift jobs cancel`); a lookup that fails stops nothing, and the
        renewer's check finds a real cancel at the next renewal anyway.
        """
        order = parse_order(payload)
        if order is None:
            return False
        job_id, attempt = order
        for ctx in self.holdings.snapshot():
            if ctx.job_id == job_id and ctx.attempt == attempt:
                return self._confirmed(ctx) and self.heard(ctx)
        return False

    def _confirmed(self, ctx: JobContext) -> bool:
        try:
            return ctx.job_id in self.store.job_cancelled_among([(ctx.job_id, ctx.attempt)])
        except DatabaseError:
            return False

    def among_lost(self, lost: Sequence[JobContext]) -> set[int]:
        """Which of the leases the renewer found gone were taken by a cancel (the poll
        fallback for a missed notification); those are heard. A failed lookup: none."""
        try:
            cancelled = self.store.job_cancelled_among([(c.job_id, c.attempt) for c in lost])
        except DatabaseError:
            return set()
        for ctx in lost:
            if ctx.job_id in cancelled:
                self.heard(ctx)
        self._renew([c for c in lost if c.job_id in cancelled])
        return cancelled

    def _renew(self, stopping: Sequence[JobContext]) -> None:
        """Extend the holds of cancelled jobs whose handlers still run here: their
        slots stay taken (a failed renewal: the hold lapses at worst, a lease later)."""
        if not stopping:
            return
        held = sorted((c.job_id, c.attempt) for c in stopping)
        try:
            self.holds.stopping_renew(held, self.events.owner, self.lease)
        except DatabaseError as exc:
            emit(log, "job.hold_renew_failed", logging.WARNING, jobs=len(held), error=exc)

    def stopped(self, ctx: JobContext) -> None:
        """The outcome of a held job was refused, its handler done (or never started):
        if an operator's cancel took it, end its hold, so its slots free — whether or
        not the cancel was heard here (a notification can be missed, and the handler
        return before the next renewal asks); a lease lost to another worker has no
        hold of ours, and the statement changes nothing. On a thread of this object's
        own (the caller may be the event loop, or a group commit's thread), one at a
        time; a failure leaves the hold to lapse."""
        with self._lock:
            self._stopped.append(ctx)
            if self._letting_go:
                return
            self._letting_go = True
        threading.Thread(target=self._let_go, name="forklift-cancel-let-go", daemon=True).start()

    def _let_go(self) -> None:
        while True:
            with self._lock:
                if not self._stopped:
                    self._letting_go = False
                    return
                ctx = self._stopped.pop(0)
            try:
                self.holds.stopping_let_go(ctx.job_id, ctx.attempt, self.events.owner)
            except DatabaseError as exc:
                emit(log, "job.hold_end_failed", logging.WARNING, job=ctx.job_id, error=exc)

    def heard(self, ctx: JobContext) -> bool:
        """The job was cancelled: tell its handler and the supervisor (once)."""
        with self._lock:
            if ctx.cancel_requested:
                return False
            ctx.cancel_requested = True
        ctx.cancel()
        self.events.emit("job.cancel_heard", ctx, logging.WARNING, effect="handler told to stop")
        if self.on_cancel is not None and ctx.stage is Stage.RUNNING:
            self.on_cancel(ctx.job)  # its handler still runs: the supervisor times it
        return True
