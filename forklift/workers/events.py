"""Where a held job's lifecycle goes: its event lines, and at its end metrics and hooks."""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from forklift import _tracing
from forklift._events import emit
from forklift.metrics import Tally
from forklift.store import ClaimedJob
from forklift.workers.context import JobContext
from forklift.workers.holdings import Holdings
from forklift.workers.wakeup import NEWS, SLOT, Wakeup

# Job events log as forklift.workers.worker, the worker's logger: log filters select on it.
log = logging.getLogger("forklift.workers.worker")


class Outcome(enum.StrEnum):
    """How one held job ended, as `on_job_end` and the metrics are told."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"  # will be retried
    DEAD = "dead"  # no attempts left, or given up on
    RELEASED = "released"  # released unfinished (stopping): the attempt does not count
    SNOOZED = "snoozed"  # forklift.Snooze: to run again later, the attempt not counted
    LEASE_LOST = "lease_lost"  # another worker owns it now; our outcome was refused
    CANCELLED = "cancelled"  # an operator cancelled it while it ran; our outcome was refused
    ERROR = "error"  # a bug in the worker; the lease expires and another attempt runs


class JobEvents:
    """Logs each job event with the fields every one carries, and ends held jobs.

    Ending a job forgets it (Holdings.end), counts it in the metrics, calls the
    `on_job_end` hook and wakes the claim loop, which may claim in its place. Every
    outcome a job can have goes through here, whichever thread records it.
    """

    def __init__(
        self,
        owner: str,
        holdings: Holdings,
        wakeup: Wakeup,
        tally: Tally | None,
        on_job_end: Callable[[ClaimedJob, str], None] | None,
    ) -> None:
        self.owner = owner
        self.holdings = holdings
        self.wakeup = wakeup
        self.tally = tally
        self.on_job_end = on_job_end
        # Told of each job whose outcome was refused, its handler done: a cancelled
        # job's hold on its limits' slots ends (Cancels.stopped).
        self.on_refused: Callable[[JobContext], None] | None = None

    def emit(
        self, event: str, ctx: JobContext, level: int = logging.INFO, **fields: object
    ) -> None:
        """One lifecycle event of a held job (never its arguments)."""
        if not log.isEnabledFor(level):
            return  # the per-job DEBUG events, at INFO: not even their fields are built
        emit(
            log,
            event,
            level,
            job=ctx.job_id,
            task=ctx.task,
            attempt=ctx.attempt,
            owner=self.owner,
            **fields,
        )

    def succeeded(self, ctx: JobContext, *, counted: bool = False) -> None:
        """`counted`: already counted with its group commit (count_succeeded)."""
        self.emit("job.succeeded", ctx, logging.DEBUG)
        self.end(ctx, Outcome.SUCCEEDED, counted=counted)

    def intend(self, contexts: list[JobContext]) -> None:
        """A group commit of these is about to be sent (metrics.Tally.intend)."""
        if self.tally is not None and self.tally.shared is not None:  # a supervisor's child
            self.tally.intend([(c.job_id, c.attempt, c.queue, c.task) for c in contexts])

    def count_succeeded(self, contexts: list[JobContext], *, intended: bool = True) -> None:
        """Count a group commit's successes (folded into its intent), first thing after
        its statement returns; [] when it was given up. `intended=False`: successes no
        intent stands for (an earlier commit's, its answer lost, found committed)."""
        if self.tally is not None:
            done = [(c.queue, c.task, c.duration) for c in contexts]
            self.tally.jobs_succeeded(done, intended=intended)

    def failed(self, ctx: JobContext, error: str, *, dead: bool, retry_in: float) -> None:
        if ctx.span is not None:
            _tracing.end_run(ctx, Outcome.DEAD if dead else Outcome.FAILED, error)
        if dead:
            self.emit("job.dead", ctx, logging.ERROR, error=error)
            self.end(ctx, Outcome.DEAD)
        else:
            self.emit("job.failed", ctx, logging.WARNING, retry_in=round(retry_in, 3), error=error)
            self.end(ctx, Outcome.FAILED)

    def lease_lost(self, ctx: JobContext, effect: str) -> None:
        """Our outcome was refused: the job is someone else's, or an operator's cancel."""
        if self.on_refused is not None:
            self.on_refused(ctx)
        if ctx.cancel_requested:
            self.emit("job.cancelled", ctx, logging.WARNING, effect=effect)
            self.end(ctx, Outcome.CANCELLED)
            return
        self.emit("job.lease_lost", ctx, logging.WARNING, effect=effect)
        self.end(ctx, Outcome.LEASE_LOST)

    def end(self, ctx: JobContext, outcome: Outcome, *, counted: bool = False) -> None:
        """The job's outcome is recorded (or refused): forget it, count it, report it."""
        if ctx.span is not None:
            _tracing.end_run(ctx, outcome, "internal error" if outcome is Outcome.ERROR else None)
        self.holdings.end(ctx)
        if self.tally is not None and not counted:
            self.tally.job(ctx.queue, ctx.task, outcome, ctx.duration)
        self._resumed(ctx)
        if self.on_job_end is not None:
            self.on_job_end(ctx.job, outcome)
        # A success only frees its slot; any other end may have put a retry in line,
        # whose due time the claim loop must look up again.
        self.wakeup.set(SLOT if outcome is Outcome.SUCCEEDED else NEWS)

    def _resumed(self, ctx: JobContext) -> None:
        """Count an attempt that resumed from a checkpoint (it read one), once it ends."""
        resumable = ctx._resumable
        if self.tally is not None and resumable is not None and resumable.resumed is not None:
            self.tally.resumed(ctx.queue, ctx.task, resumable.resumed[1])

    def returned(self, ctx: JobContext) -> None:
        """The job's handler returned (its outcome is on its way): free its slot, and
        wake the claim loop, which may claim in its place."""
        if self.holdings.free_slot(ctx):
            self.wakeup.set(SLOT)

    def snoozed(self, ctx: JobContext, seconds: float, snoozes: int) -> None:
        """The job was given back to run again in `seconds` (forklift.Snooze), its
        `snoozes`-th: its run ended (counted toward max_jobs, told to `on_job_end` and
        counted in the metrics as `snoozed`, an outcome no error rate counts), the job did
        not: no batch or workflow hears of it."""
        if ctx.span is not None:
            _tracing.end_run(ctx, Outcome.SNOOZED)
        # At DEBUG, as a success: a handler's own choice, which a poller makes often.
        self.emit("job.snoozed", ctx, logging.DEBUG, seconds=round(seconds, 3), snoozes=snoozes)
        self.holdings.end(ctx)
        if self.tally is not None:
            self.tally.job(ctx.queue, ctx.task, Outcome.SNOOZED, ctx.duration)
        self._resumed(ctx)
        if self.on_job_end is not None:
            self.on_job_end(ctx.job, Outcome.SNOOZED)
        self.wakeup.set(NEWS)  # its due time is one the claim loop must look up

    def released(self, ctx: JobContext, why: str, *, recorded: bool) -> None:
        """The job was released (`recorded`), or its release failed: forget it either way.

        Not an end (not counted toward max_jobs), but a job whose start was reported
        gets its end reported too, so the supervisor stops timing it.
        """
        if ctx.span is not None:
            _tracing.end_run(ctx, Outcome.RELEASED)
        if self.holdings.release(ctx):
            self.wakeup.set(SLOT)
        if ctx.started and self.on_job_end is not None:
            self.on_job_end(ctx.job, Outcome.RELEASED)
        self._resumed(ctx)
        if recorded:
            self.emit("job.released", ctx, reason=why)
            if self.tally is not None:
                self.tally.job(ctx.queue, ctx.task, Outcome.RELEASED, None)
