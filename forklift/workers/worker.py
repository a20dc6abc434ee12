"""Worker: one process's claim → handle → complete path, top to bottom.

The main thread claims up to its free slots (`_claim_loop`) and hands each job to an
executor thread (threads.py; a plain def handler) or to the event loop (aio.py; an
async def one), which runs it to its outcome (runs.py's `_run_job`, or its async twin
in aio.py, both through the same steps): the handler, then its completion, committed
in the handler's own effect transaction (`Recorder.commit_effect`) or handed to the
completer's group commit, or its failure (`Recorder.fail`); recorder.py holds those
fenced writes. Up to `concurrency` jobs run at once, on threads and loop together;
with tracing (_tracing.py) each attempt has its span. Beside them run the
services, each in its own module with its collaborators passed in: the lease renewer,
the completer, the listener and maintenance on threads of their own.
They share `Holdings` (the held jobs, the slots, who writes each outcome) and
`JobEvents` (how a job's end is logged, counted and reported).
Everything is created in run(), after any fork.
"""

from __future__ import annotations

import functools
import logging
import random
import time
from collections.abc import Callable, Sequence

from forklift import _db
from forklift._events import emit
from forklift._ids import application_name, make_owner
from forklift._service import Repeats, TestSignal
from forklift.app import App
from forklift.backoff import Backoff, Streak
from forklift.batch import Batch
from forklift.errors import DatabaseError, SchemaMissing
from forklift.metrics import Tally
from forklift.shared_vouch import SharedVouch
from forklift.store import Claim, ClaimedJob, Completion
from forklift.store.batches import BatchStore
from forklift.store.limits import Applying
from forklift.workers import slots
from forklift.workers.batch_ends import BatchEnds
from forklift.workers.claimer import Claimer
from forklift.workers.config import WorkerConfig
from forklift.workers.connections import WorkerConnections, detect_pooler
from forklift.workers.context import AsyncJobContext, JobContext, Reads
from forklift.workers.events import JobEvents
from forklift.workers.holdings import Holdings
from forklift.workers.idle import IdleSleep
from forklift.workers.listener import PipeSource
from forklift.workers.pacing import Pacing
from forklift.workers.prefetch import Prefetch
from forklift.workers.recorder import Recorder
from forklift.workers.runs import JobRuns, RunDeps
from forklift.workers.services import ServiceDeps, Services
from forklift.workers.wakeup import Wakeup

log = logging.getLogger(__name__)

# How long a handler's effect transaction may sit idle (the handler working, not talking
# to the database) when its task has no timeout. Every other transaction gets a fraction
# of the lease (_db.Timeouts); this one holds its row locks and the vacuum horizon while
# the handler works, so it is bounded too: give longer handlers a timeout.
EFFECT_IDLE_LIMIT = 3600.0


def task_timeout(app: App, job: ClaimedJob) -> float | None:
    """The job's timeout: the worker's own task definition decides; the row's copy (the
    producer's view) covers tasks this worker does not define."""
    task = app.tasks.get(job.task)
    return task.timeout if task is not None and task.timeout else job.timeout


def effect_idle(app: App, job: ClaimedJob, lease: float) -> float:
    """How long the job's effect transaction may sit idle: as long as its task may run
    and a lease more (the supervisor kills it at its timeout and ends its sessions), or
    EFFECT_IDLE_LIMIT for a task with no timeout."""
    timeout = task_timeout(app, job)
    return timeout + lease if timeout else EFFECT_IDLE_LIMIT


def effect_statement(app: App, job: ClaimedJob, config: WorkerConfig) -> float:
    """How long one statement of the handler's own in its effect transaction may take:
    as long as its task may run, or --effect-statement-timeout for a task with none.
    Never the worker's own bound (a third of the lease), which is for its statements."""
    return task_timeout(app, job) or config.effect_statement_timeout


# After a failed claim: 0.1 s, doubling, at most half a second between tries. A claim
# against a database that is down fails at once (connection refused, or "starting up");
# a short cap is what lets work resume within a second of the database's return.
CLAIM_RETRY = Backoff(base=0.1, factor=2.0, max=0.5, jitter=0.0)
# Back from an outage, a worker looks at expired leases only this long after its last
# failed claim, or after its liveness lock is back: the locks of live peers cut off with
# it are back by then too (a session retakes its lock within a fifth of a second of the
# database answering), so their expired leases are theirs again, not this worker's.
EXPIRY_AFTER_OUTAGE = 1.5


class ExpiryScan:
    """When the claim next looks at expired leases: every half lease, and never sooner
    than EXPIRY_AFTER_OUTAGE after this worker was cut off (its claim failed, or nothing
    vouched for it)."""

    def __init__(self, lease: float) -> None:
        self.lease = lease
        self.next = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() >= self.next

    def scanned(self) -> None:
        self.next = time.monotonic() + self.lease / 2

    def cut_off(self, until: float) -> None:
        self.next = max(self.next, until + EXPIRY_AFTER_OUTAGE)


def batch_view(app: App, batch_id: int, reads: Reads) -> Batch:
    """A handler's view of a batch (ctx.batch), read where `reads` says (JobContext):
    never on the worker's own connection, which claims and renewals must not wait
    behind."""
    return Batch(batch_id, BatchStore(reads, app.schema), app.ends)


def stop_handlers(contexts: list[JobContext]) -> list[JobContext]:
    """Tell the handlers still running at a stop to stop (ctx.cancelled); the jobs the
    worker may release: not one whose handler runs past its timeout. Its supervisor,
    killing this process for it, charges the timeout once the handler is gone (a worker
    on its own leaves it to its lease), so no other attempt runs beside the handler and
    the timeout is never lost to a release."""
    now = time.monotonic()
    for ctx in contexts:
        ctx.cancel()
    return [c for c in contexts if not (c.started and c.timeout and now - c.started_at > c.timeout)]


class Waiting:
    """What a worker waits for before any work ("waiting for migrate"; None: nothing),
    each change told to `on_change` (its process title)."""

    def __init__(self, on_change: Callable[[str | None], None] | None) -> None:
        self.on_change = on_change
        self.what: str | None = None

    def __call__(self, what: str | None) -> None:
        if what != self.what:
            self.what = what
            if self.on_change is not None:
                self.on_change(what)


class Worker:
    """One process's job loop. __init__ does no I/O; run() boots and blocks until stopped."""

    def __init__(
        self,
        app: App,
        config: WorkerConfig | None = None,
        *,
        owner: str | None = None,
        on_job_start: Callable[[ClaimedJob], None] | None = None,
        on_job_end: Callable[[ClaimedJob, str], None] | None = None,
        on_booted: Callable[[], None] | None = None,
        tally: Tally | None = None,
        on_job_cancel: Callable[[ClaimedJob], None] | None = None,
        hints_fd: int | None = None,
        on_waiting: Callable[[str | None], None] | None = None,
        wakeup: Wakeup | None = None,
        on_handler: Callable[[int, bool], None] | None = None,
        vouch: SharedVouch | None = None,
    ) -> None:
        self.app = app
        self._waiting = Waiting(on_waiting)
        self.hints_fd = hints_fd  # a supervisor's child: its hints pipe (services.py)
        self.vouch = vouch  # a supervisor's child: whether its supervisor's lock is held
        self.config = config or WorkerConfig()
        slots.check_costs(app, self.config)
        self.owner = owner or ""
        self.on_job_start = on_job_start
        self.on_job_end = on_job_end
        self.on_handler = on_handler  # (job id, whether its handler's call runs)
        self.on_booted = on_booted  # told once its services run, just before the first claim
        self.on_job_cancel = on_job_cancel  # an operator cancelled a job whose handler runs
        self.tally = tally
        self.booted: TestSignal[None] = TestSignal()  # its services exist from then on
        self.idle: TestSignal[None] = TestSignal()  # it found nothing to claim; sleeps
        self._stopping = False
        self._fast_stop = False
        # A supervisor's child: the self-pipe its supervisor writes new jobs' news to.
        self._wakeup: Wakeup | None = wakeup
        self._claimed_at = 0.0  # when the last claim began (monotonic)

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

    def run(self) -> None:
        """Claim and run jobs until request_stop(); then drain, release and return."""
        self._boot()
        try:
            self._claim_loop()
            self._drain()
        finally:
            self._shutdown()

    def _boot(self) -> None:
        cfg = self.config
        self.owner = self.owner or make_owner()
        random.seed()  # a forked child must not share its parent's jitter sequence
        if self._wakeup is None:
            self._wakeup = Wakeup()
        if self._stopping:
            self._wakeup.set()
        self._timeouts = _db.Timeouts.for_lease(cfg.lease)
        detect_pooler(self.app.dsn, self._timeouts, lambda: self._stopping, self._wakeup.wait)
        self._conns = WorkerConnections.open(
            self.app.dsn, self._timeouts, application_name(self.owner), cfg.pool_size
        )
        self.store = self._conns.store(self.app.schema)
        costs = slots.costs(self.app, cfg.concurrency)
        held = self.holdings = Holdings(cfg.concurrency, costs)
        self.claimer = Claimer.of_worker(
            self.app, self.store, self._conns.own, cfg, self.owner, held
        )
        self.prefetch = Prefetch(cfg.concurrency)
        self.pacing = Pacing(cfg, self.holdings, self.prefetch)
        self.events = JobEvents(
            self.owner, self.holdings, self._wakeup, self.tally, self.on_job_end
        )
        self.ends = BatchEnds.of_worker(self.store, self.tally, held)
        self.recorder = Recorder(self.store, self.owner, held, self.events, self.ends)
        hints = PipeSource(self.hints_fd, self.app.schema) if self.hints_fd is not None else None
        self.services = Services(
            ServiceDeps(
                cfg, self.store, self.app.dsn, self._timeouts, self.owner, self.holdings,
                self.events, self._wakeup, self.tally, self.on_job_cancel, hints, self.ends,
                self.vouch,
            )
        )  # fmt: skip
        self.runs = JobRuns(
            RunDeps(
                self.app, cfg.concurrency, self.owner, self.store, held, self.events,
                self.recorder, self.prefetch, self.services.completer,
                self._conns.async_effects, self.on_job_start, lambda: self._stopping,
                slots.SlotGate(cfg.concurrency, costs) if costs else None,
            )
        )  # fmt: skip
        completer = self.services.completer
        self.sleep = IdleSleep(cfg, self.claimer, self.pacing, completer, self._wakeup)
        self.services.start()
        emit(
            log,
            "worker.started",
            owner=self.owner,
            queues=",".join(cfg.queues),
            concurrency=cfg.concurrency,
        )
        if self.on_booted is not None:
            self.on_booted()
        self.booted.emit(None)

    def _shutdown(self) -> None:
        self.runs.stop()
        self.services.stop(timeout=self._timeouts.statement + 1)
        self._conns.close()
        assert self._wakeup is not None
        self._wakeup.close()
        emit(log, "worker.stopped", owner=self.owner, jobs=self.holdings.ended)

    # -- claiming -----------------------------------------------------------------------

    def _claim_loop(self) -> None:
        assert self._wakeup is not None
        expiry = ExpiryScan(self.config.lease)
        claim_errors = Streak(CLAIM_RETRY)
        repeats = Repeats()  # the same error every 30 s, not every retry
        while not self._stopping:
            self._release_overdue()
            free = self._free_slots()
            if self._stopping:  # recycling: the job count is reached
                break
            if free <= 0 or not self.pacing.worth_claiming(free):
                self._wakeup.wait(self.pacing.busy_wait())
                continue
            # Nothing is claimed without the liveness lock: a peer that finds it free
            # would charge whatever this worker claimed.
            if not self.services.wait_vouched(0.5):
                expiry.cut_off(time.monotonic())
                continue
            self._wakeup.clear()  # wake-ups from now on are news to the claim below
            expired = expiry.due()
            try:
                began = self._claimed_at = time.monotonic()
                claim, free = self._claim(free, expired)
                jobs = claim.jobs
                self.prefetch.observe_claim(time.monotonic() - began)
                self._waiting(None)
            except SchemaMissing as exc:
                # Not migrated yet (a migration Job may be on its way): say so calmly,
                # look again every second, start the moment the tables are there. A
                # supervisor's child leaves the saying to its supervisor (one line).
                if repeats.worth_logging(exc):
                    level = logging.DEBUG if self.hints_fd is not None else logging.WARNING
                    emit(log, "worker.schema_missing", level, error=exc)
                self._waiting("waiting for migrate")
                self._wakeup.wait(1.0)
                continue
            except DatabaseError as exc:
                delay = claim_errors.failed()
                expiry.cut_off(began + delay)
                if repeats.worth_logging(exc):  # an outage: said once, then every 30 s
                    emit(log, "worker.claim_failed", logging.WARNING, error=exc, retry_in=delay)
                self._wakeup.wait(delay)
                continue
            claim_errors.succeeded()
            if expired:
                expiry.scanned()
            if self._stopping:
                # Invariant: a graceful stop starts no new work. Release these at once.
                adopted = self.holdings.take([self._adopt(j) for j in jobs])
                self.recorder.release_or_keep(adopted, "claimed while stopping")
                break
            self.pacing.shared = claim.shared
            self.runs.dispatch([self._adopt(job) for job in jobs])
            self.services.completer.let_go()  # what the claim went ahead of, if it did
            if len(jobs) < free and not claim.again and not claim.shared:
                if not jobs:
                    self.idle.emit(None)
                self.sleep.sleep(self._claimed_at)

    def _claim(self, free: int, expired: bool) -> tuple[Claim, int]:
        """Claim up to `free` jobs, or more: the successes queued for group commit
        complete in the same round trip and transaction (the claim sees the slots they
        free), so they do not count against the jobs held. (The claim, how many it
        asked for.) Without that a worker whose completions lag by a claim's worth
        alternates a full claim with one of a few jobs, each costing the same. A claim
        that every slot waits on goes ahead of the successes instead (_claim_waited_on)."""
        asked = free
        if self._claim_waited_on():
            return self.services.completer.ahead_of(
                lambda: self.claimer.claim(free, expired=expired)
            ), free

        def claim(rows: Sequence[Completion]) -> Claim:
            nonlocal asked
            if rows:
                asked = max(free, self._free_slots(leaving=len(rows)))
            return self.claimer.claim(asked, expired=expired, complete=rows)

        return self.services.completer.riding(claim), asked

    def _claim_waited_on(self) -> bool:
        """Whether the claim goes ahead of the successes queued (Completer.ahead_of):
        nothing runs or waits for a slot, so every slot waits on it, and jobs are not
        claimed ahead (they take longer than a few claims: a round trip more per job
        is nothing to them). Under limits the claim takes the successes with it, to see
        the slots and keys they free."""
        return (
            self.pacing.ahead == 0
            and self.holdings.idle()
            and self.claimer.applying is Applying.NONE
        )

    def _free_slots(self, leaving: int = 0) -> int:
        """Jobs to claim now (Pacing.free); past max_jobs, none, and once all are done,
        stop."""
        free, held = self.pacing.free(leaving)
        max_jobs = self.config.max_jobs
        if max_jobs is not None:
            ended = self.holdings.ended
            left = max_jobs - ended - held
            if left <= 0 and not held:
                emit(log, "worker.recycle", owner=self.owner, jobs=ended)
                self._stopping = True
            free = min(free, left)
        return free

    def _release_overdue(self) -> None:
        """Claimed-ahead jobs that would wait too long behind a running one are released to
        ready at once (fenced, the attempt not counted) for another worker to take."""
        if not self.holdings.waiting():
            return
        if self.prefetch.overdue(self.holdings.longest_running(time.monotonic())):
            self.recorder.release_waiting("waited too long for a slot", self.runs.hand_over)

    def _adopt(self, job: ClaimedJob) -> JobContext:
        task = self.app.tasks.get(job.task)
        kind = AsyncJobContext if task is not None and task.is_async else JobContext
        ctx = kind(
            job,
            self.store,
            effect_idle=effect_idle(self.app, job, self.config.lease),
            effect_statement=effect_statement(self.app, job, self.config),
            batch_of=functools.partial(batch_view, self.app),
            build_job=self.app._new_job,
            timeout=task_timeout(self.app, job),
            owner=self.owner,
            max_bytes=self.app.max_result_bytes,
        )
        if self.on_handler is not None:
            ctx.on_handler = functools.partial(self.on_handler, job.id)
        self.holdings.adopt(ctx)
        if self.tally is not None:
            self.tally.wait(job.queue, job.wait)
        self.events.emit("job.claimed", ctx, logging.DEBUG)
        return ctx

    # -- stopping -----------------------------------------------------------------------

    def _drain(self) -> None:
        """Wait up to the grace period for held jobs to finish; release the rest."""
        assert self._wakeup is not None
        # The loop's last claim may have gone ahead of the successes (Completer.ahead_of):
        # written now, or the wait below would wait out the grace for them.
        self.services.completer.let_go()
        # A graceful stop starts nothing new: what waits for a slot is released now.
        self.recorder.release_or_keep(self.holdings.take_waiting(), "not started before the stop")
        for ctx in self.holdings.running():
            ctx.stop()  # a resumable loop ends at its next item, checkpointed, given back
        deadline = time.monotonic() + (0.0 if self._fast_stop else self.config.grace)
        while len(self.holdings) and time.monotonic() < deadline and not self._fast_stop:
            self._wakeup.wait(min(0.5, deadline - time.monotonic()))
        # Jobs whose handler already returned are only waiting for their group commit:
        # the completer flushes them on shutdown. Release the ones still running.
        why = "stopping past grace" if not self._fast_stop else "fast stop"
        self.recorder.release_at_stop(stop_handlers(self.holdings.take_running()), why)
