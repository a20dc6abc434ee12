"""Recording a held job's outcome in the database, fenced by owner and attempt.

Every write that ends a job's attempt here goes through one of four methods: the
effect transaction's commit with the completion (`commit_effect`, awaited as
`commit_effect_async`), a failed attempt (`fail`), a snooze (`snooze`), or releasing
jobs unfinished (`release`, which `release_waiting` and `release_at_stop` try again
when it fails: a job is never forgotten while still `running`). Group-committed
successes go through the completer instead. Each is handed jobs whose outcome its
caller took (Holdings.take): no other thread writes theirs, and the renewer never calls
one of them lost.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any

from forklift._events import emit
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.store import (
    AsyncEffect,
    Effect,
    JobState,
    JobStore,
    job_snooze_many,
    job_succeeded_among,
)
from forklift.task import Task
from forklift.workers import checkpoints, executor
from forklift.workers.batch_ends import BatchEnds
from forklift.workers.context import JobContext, Writing
from forklift.workers.events import JobEvents
from forklift.workers.executor import Result
from forklift.workers.holdings import Holdings

log = logging.getLogger("forklift.workers.worker")

# A task this worker does not know retries on this schedule (1 s, 2 s, 4 s, ...): long
# enough for a rolling deploy to bring up workers that know it.
UNKNOWN_TASK_RETRY = Backoff()

# A failed release is tried again after 0.1 s, doubling, at most half a second apart.
RELEASE_BACKOFF = Backoff(base=0.1, factor=2.0, max=0.5, jitter=0.0)

# How long a stopping worker tries again to give its jobs back when the statement fails
# (their leases renewed meanwhile), within the supervisor's --kill-grace (3 s). After
# that the jobs stay `running` until their leases expire, and the attempt counts.
RELEASE_RETRY = 2.0


class Recorder:
    def __init__(
        self,
        store: JobStore,
        owner: str,
        holdings: Holdings,
        events: JobEvents,
        ends: BatchEnds | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.holdings = holdings
        self.events = events
        self.ends = ends  # told the batch of a job that ended here, after the commit
        self._release_errors = Streak(RELEASE_BACKOFF)
        self._release_at = 0.0  # the next release of waiting jobs after a failed one (monotonic)

    def commit_effect(self, ctx: JobContext, effect: Effect) -> Result | None:
        """Complete the job inside the handler's transaction; commit both or neither.

        Returns None when the outcome is recorded, or the failure to record instead.
        """
        try:
            owned = effect.commit_completing(
                ctx.job_id, ctx.attempt, self.owner, ctx.result_json, ctx.final_progress
            )
        except DatabaseError as exc:
            if not self._committed_after_all(ctx, exc):
                return self._commit_lost(ctx, exc)
            owned = True
        if self._effect_ended(ctx, owned) and self.ends is not None:
            self.ends.ended([ctx.job.batch_id])
        return None

    async def commit_effect_async(self, ctx: JobContext, effect: AsyncEffect) -> Result | None:
        """commit_effect for an async handler's effect, on the event loop (the batch's end,
        a statement on the worker's own connection, on a thread)."""
        try:
            owned = await effect.commit_completing(
                ctx.job_id, ctx.attempt, self.owner, ctx.result_json, ctx.final_progress
            )
        except DatabaseError as exc:
            if not await asyncio.to_thread(self._committed_after_all, ctx, exc):
                return await asyncio.to_thread(self._commit_lost, ctx, exc)
            owned = True
        batch_id = ctx.job.batch_id
        if self._effect_ended(ctx, owned) and self.ends is not None and batch_id is not None:
            await asyncio.to_thread(self.ends.ended, [batch_id])
        return None

    def _effect_ended(self, ctx: JobContext, owned: bool) -> bool:
        """Record the end of a committed effect transaction: the job succeeded (True), or,
        its lease not ours any more, the effect and the completion rolled back."""
        ctx.writing = Writing.WRITTEN
        if not owned:
            self.events.lease_lost(ctx, "rolled back")
            return False
        self.events.succeeded(ctx)
        return True

    def _commit_lost(self, ctx: JobContext, exc: DatabaseError) -> Result | None:
        """The effect's commit failed and did not commit. Lost with its connection (ended
        from outside, the database restarting), it is no fault of the job's: the job
        is released uncharged, to run again (None). Refused (a constraint, a data error),
        or not released now, it is the attempt's failure, for the caller to record."""
        if exc.transient and self.release([ctx], f"its effect's commit was lost: {exc}"):
            return None
        return executor.failure(exc)

    def _committed_after_all(self, ctx: JobContext, exc: DatabaseError) -> bool:
        """Whether the commit that raised `exc` committed anyway: a connection lost with
        the COMMIT on its way leaves its outcome unknown, and a job whose effect and
        completion did commit is no failure (counted one, its failure write is refused
        and it reads as a lease lost). Asked a few times within a second or so, as the
        database may take a moment to take connections again."""
        if not exc.transient:
            return False
        for wait in (0.0, 0.2, 0.4, 0.8):
            time.sleep(wait)
            try:
                return bool(job_succeeded_among(self.store, [(ctx.job_id, ctx.attempt)]))
            except DatabaseError:
                continue
        return False

    def fail(self, ctx: JobContext, task: Task[Any, Any] | None, result: Result) -> None:
        if result.interrupted and (ctx.stopping or ctx.cancelled):
            # ctx.iterate ended at an item boundary, checkpointed: given back to resume,
            # the attempt not counted (a stop is no fault of the job's).
            self.release_at_stop([ctx], "interrupted at a checkpoint by the stop")
            return
        checkpoints.write_unwritten(self.store, self.owner, [ctx])  # a retry resumes it
        job = ctx.job
        dead = result.give_up or job.attempt >= job.max_attempts
        if result.retry_delay is not None:
            delay = result.retry_delay
        else:
            delay = (task.backoff if task is not None else UNKNOWN_TASK_RETRY).delay(job.attempt)
        unrecorded = False
        try:
            state = self.store.job_fail(
                job.id,
                job.attempt,
                self.owner,
                dead=dead,
                delay=delay,
                error=result.error,
                traceback=result.traceback,
            )
            refused = state is None
            ended = state is JobState.DEAD
        except DatabaseError as exc:
            # Still ours in the database, unknown to this worker once forgotten: the
            # claim loop releases it (Holdings.doubt), uncounted, to run again.
            emit(log, "job.fail_record_failed", logging.ERROR, job=job.id, error=exc)
            refused = ended = False
            unrecorded = True
        ctx.writing = Writing.WRITTEN
        if refused:
            self.events.lease_lost(ctx, "outcome refused")
        else:
            self.events.failed(ctx, result.error, dead=dead, retry_in=delay)
        if unrecorded:  # once forgotten (a reconciliation before would keep it)
            self.holdings.doubt()
        if ended and self.ends is not None:
            self.ends.ended([job.batch_id])

    def snooze(self, ctx: JobContext, task: Task[Any, Any] | None, result: Result) -> None:
        """Give the job back to run again in `result.snooze` seconds, its attempt not
        counted and a snooze counted instead; past its task's max_snoozes (the worker's
        declaration: it runs only tasks it declares), the run is a failed attempt."""
        assert result.snooze is not None
        bound = task.max_snoozes if task is not None else 0
        checkpoints.write_unwritten(self.store, self.owner, [ctx])  # the next run resumes it
        lease = (ctx.job_id, ctx.attempt, result.snooze, bound)
        try:
            rows = job_snooze_many(self.store, [lease], self.owner)
        except DatabaseError as exc:
            # Still ours in the database: the claim loop releases it (Holdings.doubt),
            # uncounted, to run again at once; its snooze is lost, not its attempt.
            emit(log, "job.snooze_failed", logging.ERROR, job=ctx.job_id, error=exc)
            ctx.writing = Writing.WRITTEN
            self.events.released(ctx, "its snooze was not recorded", recorded=False)
            self.holdings.doubt()
            return
        if not rows:
            ctx.writing = Writing.WRITTEN
            self.events.lease_lost(ctx, "snooze refused")
        elif not rows[0].snoozed:
            self.fail(ctx, task, executor.over_snoozed(rows[0].snoozes, bound))
        else:
            ctx.writing = Writing.WRITTEN
            self.events.snoozed(ctx, result.snooze, rows[0].snoozes + 1)

    def release(self, contexts: Sequence[JobContext], why: str, *, last_try: bool = False) -> bool:
        """Give jobs back to ready at once (fenced), without counting the attempt.

        False when the statement failed. Then the jobs stay held, their leases renewed,
        for the caller to try again: forgotten, a job would stay `running` until its
        lease ran out and cost an attempt without having run. Only on the `last_try`
        (the worker is exiting) are they forgotten anyway.
        """
        if not contexts:
            return True
        recorded = True
        checkpoints.write_unwritten(self.store, self.owner, contexts)  # the next resumes it
        try:
            released = self.store.job_release_many(
                [(c.job_id, c.attempt) for c in contexts], self.owner
            )
        except DatabaseError as exc:
            level = logging.ERROR if last_try else logging.WARNING
            emit(log, "job.release_failed", level, jobs=len(contexts), error=exc)
            if not last_try:
                return False
            released, recorded = set(), False
        for ctx in contexts:
            ctx.writing = Writing.WRITTEN
        for ctx in contexts:
            self.events.released(ctx, why, recorded=ctx.job_id in released)
        if not recorded:  # still ours in the database: released by a reconciliation
            self.holdings.doubt()
        return recorded

    def release_waiting(self, why: str, requeue: Callable[[JobContext], None]) -> None:
        """Release the jobs waiting for a slot. When that fails they stay held (and
        renewed): an executor may run them after all (`requeue` queues again those one
        passed over meanwhile), or a try a moment later gives them back."""
        if time.monotonic() < self._release_at:
            return
        taken = self.holdings.take_waiting(reserved=True)
        if self.release(taken, why):
            self._release_errors.succeeded()
        else:
            for ctx in self.holdings.untake(taken):
                requeue(ctx)
            self._release_at = time.monotonic() + self._release_errors.failed()

    def release_at_stop(self, contexts: list[JobContext], why: str) -> None:
        """Give jobs back as the worker stops; a failed statement is tried again for up
        to RELEASE_RETRY seconds (the lease renewer runs until the worker exits)."""
        retries = Streak(RELEASE_BACKOFF)
        deadline = time.monotonic() + RELEASE_RETRY
        while not self.release(contexts, why):
            left = deadline - time.monotonic()
            if left <= 0:
                self.release(contexts, why, last_try=True)
                return
            time.sleep(min(retries.failed(), left))

    def release_or_keep(self, contexts: list[JobContext], why: str) -> None:
        """Release jobs taken; if that fails they stay this worker's, for the stop to
        release (`release_at_stop`)."""
        if not self.release(contexts, why):
            self.holdings.untake(contexts)
