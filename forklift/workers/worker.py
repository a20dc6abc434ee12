"""Worker: the claim → heartbeat → handle loop of one process.

Threads: the main loop claims and dispatches; `concurrency` executor threads run
handlers; a heartbeat thread renews leases; a completer group-commits successes; a
listener turns NOTIFY into wake-ups. Everything is created in run(), after any fork.
"""

from __future__ import annotations

import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence

from forklift import _db
from forklift._events import emit
from forklift._ids import make_owner
from forklift.app import App
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.metrics import Tally
from forklift.store import ClaimedJob, Effect, JobStore
from forklift.workers import executor
from forklift.workers.completer import CompleterMixin
from forklift.workers.config import WorkerConfig
from forklift.workers.context import JobContext
from forklift.workers.executor import Outcome
from forklift.workers.heartbeat import HeartbeatMixin
from forklift.workers.listener import ListenerMixin
from forklift.workers.maintenance import MaintenanceMixin
from forklift.workers.wakeup import Wakeup

log = logging.getLogger(__name__)

# After a failed claim: 0.2 s, doubling, at most 5 s between tries.
CLAIM_RETRY = Backoff(base=0.2, factor=2.0, max=5.0, jitter=0.0)


class Worker(CompleterMixin, HeartbeatMixin, ListenerMixin, MaintenanceMixin):
    """One process's job loop. __init__ does no I/O; run() boots and blocks until stopped."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig | None = None,
        *,
        owner: str | None = None,
        on_job_start: Callable[[ClaimedJob], None] | None = None,
        on_job_end: Callable[[ClaimedJob, str], None] | None = None,
        tally: Tally | None = None,
    ) -> None:
        self.app = app
        self.config = config or WorkerConfig()
        self.owner = owner or ""
        self.jobs_done = 0
        self.on_job_start = on_job_start
        self.on_job_end = on_job_end
        self.tally = tally
        self._stopping = False
        self._fast_stop = False
        self._wakeup: Wakeup | None = None

    # -- control (safe from signal handlers) --------------------------------------------

    def request_stop(self, *, fast: bool = False) -> None:
        """Stop claiming; finish within the grace period (or release now, if fast)."""
        self._stopping = True
        self._fast_stop = self._fast_stop or fast
        if self._wakeup is not None:
            self._wakeup.set()

    @property
    def stopping(self) -> bool:
        return self._stopping

    # -- boot and shutdown --------------------------------------------------------------

    def _boot(self) -> None:
        cfg = self.config
        self.owner = self.owner or make_owner()
        random.seed()  # a forked child must not share its parent's jitter sequence
        self._wakeup = Wakeup()
        if self._stopping:
            self._wakeup.set()
        self._timeouts = _db.Timeouts.for_lease(cfg.lease)
        self._pool = _db.make_pool(
            self.app.dsn,
            self._timeouts,
            # claims, renewals and completions, plus the handlers' effect transactions
            max_size=cfg.pool_size + 3,
            name=f"worker-{os.getpid()}",
            application_name=f"forklift-worker:{os.getpid()}",
        )
        self._pool.open(wait=False)
        self.store = JobStore(self._pool, self.app.schema)
        self._held: dict[int, JobContext] = {}
        self._active = 0  # claimed jobs whose handler has not returned yet
        self._held_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._work: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self._closing = threading.Event()
        self._threads = [
            threading.Thread(target=self._execute_loop, name=f"forklift-exec-{i}", daemon=True)
            for i in range(cfg.concurrency)
        ]
        self._threads.append(
            threading.Thread(target=self._heartbeat_loop, name="forklift-heartbeat", daemon=True)
        )
        self._threads.append(
            threading.Thread(target=self._complete_loop, name="forklift-completer", daemon=True)
        )
        if cfg.listen:
            self._threads.append(
                threading.Thread(target=self._listen_loop, name="forklift-listener", daemon=True)
            )
        for t in self._threads:
            t.start()
        emit(
            log,
            "worker.started",
            owner=self.owner,
            queues=",".join(cfg.queues),
            concurrency=cfg.concurrency,
        )

    def _shutdown(self) -> None:
        self._closing.set()
        for _ in range(self.config.concurrency):
            self._work.put(None)
        self._done.put(None)
        for t in self._threads:
            if t.name == "forklift-completer":
                t.join(timeout=self._timeouts.statement + 1)
        self._pool.close(timeout=2.0)
        assert self._wakeup is not None
        self._wakeup.close()
        emit(log, "worker.stopped", owner=self.owner, jobs=self.jobs_done)

    # -- the main loop ------------------------------------------------------------------

    def run(self) -> None:
        """Claim and run jobs until request_stop(); then drain, release and return."""
        self._boot()
        try:
            self._claim_loop()
            self._drain()
        finally:
            self._shutdown()

    def _claim_loop(self) -> None:
        cfg = self.config
        assert self._wakeup is not None
        next_maintenance = time.monotonic()
        next_expiry_check = time.monotonic()
        claim_errors = Streak(CLAIM_RETRY)
        while not self._stopping:
            if cfg.maintenance and time.monotonic() >= next_maintenance:
                self.maintain_once()
                next_maintenance = time.monotonic() + cfg.maintenance_interval
            free = self._free_slots()
            if self._stopping:  # recycling: the job count is reached
                break
            if free <= 0:
                self._wakeup.wait(cfg.poll_interval)
                continue
            self._wakeup.clear()  # wake-ups from now on are news to the claim below
            expired = time.monotonic() >= next_expiry_check
            try:
                jobs = self.store.job_claim(
                    cfg.queues, self.owner, free, cfg.lease, expired=expired
                )
            except DatabaseError as exc:
                delay = claim_errors.failed()
                emit(log, "worker.claim_failed", logging.WARNING, error=exc, retry_in=delay)
                self._wakeup.wait(delay)
                continue
            claim_errors.succeeded()
            if expired:
                next_expiry_check = time.monotonic() + cfg.lease / 2
            if self._stopping:
                # Invariant: a graceful stop starts no new work. Give these back at once.
                self._release([self._adopt(j) for j in jobs], "claimed while stopping")
                break
            for job in jobs:
                self._work.put(self._adopt(job))
            if len(jobs) < free:
                self._wakeup.wait(self._idle_wait())

    def _free_slots(self) -> int:
        cfg = self.config
        with self._held_lock:
            # A slot frees when its handler returns; its completion may still be on its
            # way to the database (group commit), which must not hold up the next claim.
            # But completions waiting for a slow database count too: never hold more
            # than twice the slots, or leases pile up faster than they can be renewed.
            held = len(self._held)
            free = min(cfg.concurrency - self._active, 2 * cfg.concurrency - held)
        if cfg.max_jobs is not None:
            left = cfg.max_jobs - self.jobs_done - held
            if left <= 0 and not held:
                emit(log, "worker.recycle", owner=self.owner, jobs=self.jobs_done)
                self._stopping = True
            free = min(free, left)
        return free

    def _idle_wait(self) -> float:
        """Sleep until the next delayed job is due, or the poll interval, whichever first."""
        try:
            due_in = self.store.job_next_available(self.config.queues)
        except DatabaseError:
            return self.config.poll_interval
        if due_in is None:
            return self.config.poll_interval
        return min(self.config.poll_interval, due_in + 0.001)

    def _adopt(self, job: ClaimedJob) -> JobContext:
        ctx = JobContext(job, self.store)
        with self._held_lock:
            self._held[job.id] = ctx
            self._active += 1
        if self.tally is not None:
            self.tally.wait(job.queue, job.wait)
        self._job_event("job.claimed", ctx, logging.DEBUG)
        return ctx

    def _free_slot(self, ctx: JobContext, *, wake: bool = True) -> None:
        with self._held_lock:
            if ctx.slot_freed:
                return
            ctx.slot_freed = True
            self._active -= 1
        if wake:
            assert self._wakeup is not None
            self._wakeup.set()

    def _job_event(
        self, event: str, ctx: JobContext, level: int = logging.INFO, **fields: object
    ) -> None:
        """One lifecycle event of a held job, with the fields every job event carries."""
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

    def _succeeded(self, ctx: JobContext) -> None:
        self._job_event("job.succeeded", ctx, logging.DEBUG)
        self._forget(ctx, "succeeded")

    def _lease_lost(self, ctx: JobContext, effect: str) -> None:
        self._job_event("job.lease_lost", ctx, logging.WARNING, effect=effect)
        self._forget(ctx, "lease_lost")

    def _forget(self, ctx: JobContext, outcome: str) -> None:
        self._free_slot(ctx, wake=False)  # the wake-up below covers it
        with self._held_lock:
            if self._held.get(ctx.job_id) is ctx:
                del self._held[ctx.job_id]
        self.jobs_done += 1
        if self.tally is not None:
            self.tally.job(ctx.queue, ctx.task, outcome, ctx.duration)
        if self.on_job_end is not None:
            self.on_job_end(ctx.job, outcome)
        assert self._wakeup is not None
        self._wakeup.set()

    def _drain(self) -> None:
        """Wait up to the grace period for held jobs to finish; release the rest."""
        assert self._wakeup is not None
        deadline = time.monotonic() + (0.0 if self._fast_stop else self.config.grace)
        while self._held_snapshot() and time.monotonic() < deadline and not self._fast_stop:
            self._wakeup.wait(min(0.5, deadline - time.monotonic()))
        # Jobs whose handler already returned are only waiting for their group commit:
        # the completer flushes them on shutdown. Release the ones still running.
        left = [c for c in self._held_snapshot() if not c.slot_freed]
        if left:
            for ctx in left:
                ctx.cancelled.set()
            self._release(left, "stopping past grace" if not self._fast_stop else "fast stop")

    def _held_snapshot(self) -> list[JobContext]:
        with self._held_lock:
            return list(self._held.values())

    def _release(self, contexts: Sequence[JobContext], why: str) -> None:
        if not contexts:
            return
        with self._flush_lock:
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
            self._free_slot(ctx)
            if ctx.job_id in released:
                self._job_event("job.released", ctx, reason=why)
                if self.tally is not None:
                    self.tally.job(ctx.queue, ctx.task, "released", None)
            with self._held_lock:
                self._held.pop(ctx.job_id, None)

    # -- executors ----------------------------------------------------------------------

    def _execute_loop(self) -> None:
        while True:
            ctx = self._work.get()
            if ctx is None:
                return
            try:
                self._execute(ctx)
            except Exception:  # never lose the thread: a bug here must not stall capacity
                log.exception("internal error while running job %s", ctx.job_id)
                self._forget(ctx, "error")

    def _execute(self, ctx: JobContext) -> None:
        job = ctx.job
        if self._stopping:
            # Claimed just before the stop and not started: no new work once stopping.
            self._release([ctx], "not started before the stop")
            return
        if self.on_job_start is not None:
            self.on_job_start(job)
        started = time.monotonic()
        task = self.app.tasks.get(job.task)
        if task is None:
            outcome = executor.give_up(
                f"UnknownTaskError: no task named {job.task!r} is registered in this worker"
            )
        elif (problem := task.misfit(job.args)) is not None:
            outcome = executor.give_up(f"ArgumentError: {job.task}: {problem}")
        else:
            outcome = executor.call(task.fn, (ctx,), job.args)
        ctx.duration = time.monotonic() - started
        effect = ctx.take_effect()
        if effect is not None:
            if not outcome.succeeded:
                effect.rollback()
            elif (failed := self._commit_effect(ctx, effect)) is None:
                return
            else:
                outcome = failed
        if outcome.succeeded:
            self._free_slot(ctx)
            self._done.put(ctx)  # group-committed by the completer
        else:
            self._record_failure(ctx, outcome)

    def _commit_effect(self, ctx: JobContext, effect: Effect) -> Outcome | None:
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
                self._lease_lost(ctx, "rolled back")
                return None  # nothing more to record: the job is not ours any more
        self._succeeded(ctx)
        return None

    def _record_failure(self, ctx: JobContext, outcome: Outcome) -> None:
        job = ctx.job
        dead = outcome.give_up or job.attempt >= job.max_attempts
        if outcome.retry_delay is not None:
            delay = outcome.retry_delay
        else:
            task = self.app.tasks.get(job.task)
            delay = task.backoff.delay(job.attempt) if task is not None else 0.0
        with ctx.outcome_lock:
            try:
                state = self.store.job_fail(
                    job.id,
                    job.attempt,
                    self.owner,
                    dead=dead,
                    delay=delay,
                    error=outcome.error,
                    traceback=outcome.traceback,
                )
            except DatabaseError as exc:
                # The lease will expire and another attempt will record what happens.
                emit(log, "job.fail_record_failed", logging.ERROR, job=job.id, error=exc)
                state = "unrecorded"
            ctx.finished = True
        if state is None:
            self._lease_lost(ctx, "outcome refused")
            return
        if dead:
            self._job_event("job.dead", ctx, logging.ERROR, error=outcome.error)
        else:
            self._job_event(
                "job.failed", ctx, logging.WARNING, retry_in=round(delay, 3), error=outcome.error
            )
        self._forget(ctx, "dead" if dead else "failed")
