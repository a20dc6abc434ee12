"""Recording a held job's outcome in the database, fenced by owner and attempt.

Every write that ends a job's attempt here goes through one of three methods: the
effect transaction's commit with the completion (`commit_effect`), a failed attempt
(`fail`), or giving jobs back unfinished (`release`). Group-committed successes go
through the completer instead. Each write holds the job's outcome lock (or the
statement lock) so the lease renewer never calls a job lost that just ended.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from forklift._events import emit
from forklift.backoff import Backoff
from forklift.errors import DatabaseError
from forklift.store import Effect, JobStore
from forklift.task import Task
from forklift.workers import executor
from forklift.workers.context import JobContext
from forklift.workers.events import JobEvents
from forklift.workers.executor import Result
from forklift.workers.holdings import Holdings

log = logging.getLogger("forklift.workers.worker")

# A task this worker does not know retries on this schedule (1 s, 2 s, 4 s, ...): long
# enough for a rolling deploy to bring up workers that know it.
UNKNOWN_TASK_RETRY = Backoff()


class Recorder:
    def __init__(self, store: JobStore, owner: str, holdings: Holdings, events: JobEvents) -> None:
        self.store = store
        self.owner = owner
        self.holdings = holdings
        self.events = events

    def commit_effect(self, ctx: JobContext, effect: Effect) -> Result | None:
        """Complete the job inside the handler's transaction; commit both or neither.

        Returns None when the outcome is recorded, or the failure to record instead.
        """
        with ctx.outcome_lock:
            try:
                owned = effect.commit_completing(ctx.job_id, ctx.attempt, self.owner)
            except DatabaseError as exc:
                return executor.failure(exc)
            ctx.finished = True
            if not owned:
                self.events.lease_lost(ctx, "rolled back")
                return None  # nothing more to record: the job is not ours any more
        self.events.succeeded(ctx)
        return None

    def fail(self, ctx: JobContext, task: Task[Any, Any] | None, result: Result) -> None:
        job = ctx.job
        dead = result.give_up or job.attempt >= job.max_attempts
        if result.retry_delay is not None:
            delay = result.retry_delay
        else:
            delay = (task.backoff if task is not None else UNKNOWN_TASK_RETRY).delay(job.attempt)
        with ctx.outcome_lock:
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
            except DatabaseError as exc:
                # The lease will expire and another attempt will record what happens.
                emit(log, "job.fail_record_failed", logging.ERROR, job=job.id, error=exc)
                refused = False
            ctx.finished = True
        if refused:
            self.events.lease_lost(ctx, "outcome refused")
        else:
            self.events.failed(ctx, result.error, dead=dead, retry_in=delay)

    def release(self, contexts: Sequence[JobContext], why: str) -> None:
        """Give jobs back to ready at once (fenced), without counting the attempt."""
        if not contexts:
            return
        with self.holdings.statement_lock:
            try:
                released = self.store.job_release_many(
                    [(c.job_id, c.attempt) for c in contexts], self.owner
                )
            except DatabaseError as exc:
                emit(log, "job.release_failed", logging.ERROR, jobs=len(contexts), error=exc)
                released = set()
            for ctx in contexts:
                ctx.finished = True
        for ctx in contexts:
            self.events.released(ctx, why, recorded=ctx.job_id in released)
