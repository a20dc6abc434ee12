"""Running claimed jobs: a plain def handler on an executor thread (threads.py), an
async def one on the worker's event loop (aio.py), each to its outcome, through the same
steps around the handler's call (`begin`, `returned`, `record`: aio.JobSteps)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from forklift import _tracing
from forklift.app import App
from forklift.errors import DatabaseError
from forklift.store import AsyncEffect, ClaimedJob, Effect, JobStore, job_trace_contexts
from forklift.task import Task
from forklift.workers import executor, progress
from forklift.workers.aio import AsyncRunner, Begin
from forklift.workers.completer import Completer
from forklift.workers.connections import AsyncEffects
from forklift.workers.context import AsyncJobContext, JobContext, Writing
from forklift.workers.events import JobEvents, Outcome
from forklift.workers.executor import Result
from forklift.workers.holdings import Holdings
from forklift.workers.prefetch import Prefetch
from forklift.workers.recorder import Recorder
from forklift.workers.slots import SlotGate
from forklift.workers.threads import ExecutorThreads

log = logging.getLogger("forklift.workers.worker")


@dataclass(frozen=True)
class RunDeps:
    """What running jobs needs of its worker, built after fork."""

    app: App
    concurrency: int
    owner: str
    store: JobStore
    holdings: Holdings
    events: JobEvents
    recorder: Recorder
    prefetch: Prefetch
    completer: Completer
    async_effects: AsyncEffects
    on_job_start: Callable[[ClaimedJob], None] | None
    stopping: Callable[[], bool]
    gate: SlotGate | None = None  # some task costs more than one slot (workers/slots.py)


class JobRuns:
    """Runs the jobs the claim loop hands over, up to `concurrency` at once: threads
    start as plain handlers need them, the event loop with the first async job."""

    def __init__(self, deps: RunDeps) -> None:
        d = deps
        self.app = d.app
        self.owner = d.owner
        self.store = d.store
        self.holdings = d.holdings
        self.events = d.events
        self.recorder = d.recorder
        self.prefetch = d.prefetch
        self.completer = d.completer
        self.on_job_start = d.on_job_start
        self.stopping = d.stopping
        self.gate = d.gate
        self.threads = ExecutorThreads(d.concurrency, self._execute)
        self.aio = AsyncRunner(d.app, d.owner, self, d.recorder, d.events, d.async_effects)
        self.tracer = _tracing.tracer()  # None: no tracer provider configured

    def stop(self) -> None:
        """End the threads (each after its job) and the event loop (its jobs cancelled:
        the worker released them)."""
        self.threads.stop()
        self.aio.stop()

    def dispatch(self, contexts: Sequence[JobContext]) -> None:
        """Hand claimed jobs to their runners (with their trace contexts, when traced)."""
        if self.tracer is not None and contexts:
            try:
                rows = job_trace_contexts(self.store, [c.job_id for c in contexts])
                found = _tracing.contexts(rows)
            except DatabaseError:
                found = {}  # their spans start new traces: no job waits on tracing
            for ctx in contexts:
                ctx.trace_context = found.get(ctx.job_id)
        on_loop = [c for c in contexts if isinstance(c, AsyncJobContext)]
        if on_loop:
            self.aio.submit(on_loop)
        for ctx in contexts:
            if not isinstance(ctx, AsyncJobContext):
                self.threads.submit(ctx)

    def hand_over(self, ctx: JobContext) -> None:
        """Hand over one job (a job an executor passed over, queued again)."""
        if isinstance(ctx, AsyncJobContext):
            self.aio.submit([ctx])
        else:
            self.threads.submit(ctx)

    def _execute(self, ctx: JobContext) -> None:
        try:
            self._run_job(ctx)
        except Exception:  # never lose the thread: a bug here must not stall capacity
            log.exception("internal error while running job %s", ctx.job_id)
            self.events.end(ctx, Outcome.ERROR)

    def _run_job(self, ctx: JobContext) -> None:
        """Run one claimed job's handler, then record its outcome (or hand it over)."""
        slots = 0
        if self.gate is not None:  # some task costs more than one slot (workers/slots.py)
            entered = self.gate.enter(ctx.task, lambda: ctx.writing is not Writing.NONE)
            if entered is None:  # taken while it waited: passed over (Holdings.start)
                self.begin(ctx)
                return
            slots = entered
        try:
            ran = self._call(ctx)
        finally:
            if self.gate is not None and slots:
                self.gate.leave(slots)
        if ran is None:
            return
        task, result, started = ran
        result, effect = self.returned(ctx, result, started)
        assert effect is None or isinstance(effect, Effect)
        if not self.take(ctx):  # released (or being) at a stop past its grace
            if effect is not None:
                effect.rollback()
            return
        if effect is not None:
            if not result.succeeded:
                effect.rollback()
            elif (failed := self.recorder.commit_effect(ctx, effect)) is None:
                return
            else:
                result = failed
        self.record(ctx, task, result)

    def _call(self, ctx: JobContext) -> tuple[Task[Any, Any] | None, Result, float] | None:
        """Call the job's handler, if it is to run now (begin): its task, what it
        returned or raised, and when it started."""
        begin = self.begin(ctx)
        if begin is Begin.RELEASE:
            self.release(ctx)
        if begin is not Begin.RUN:
            return None
        task = self.app.tasks.get(ctx.task)
        token = _tracing.activate(ctx)
        started = time.monotonic()
        try:
            return task, executor.run(task, ctx, self.owner), started
        finally:
            _tracing.deactivate(token)

    # The steps around a handler's call, the same on a thread and on the loop (aio.JobSteps).

    def begin(self, ctx: JobContext) -> Begin:
        """Whether the job's handler is to run now (it was not released, the worker is
        not stopping, no operator cancelled it); if so, its start is told and traced."""
        if not self.holdings.start(ctx, time.monotonic()):
            return Begin.SKIP  # released while it waited (overdue, or the stop): not ours
        if self.stopping():
            # Claimed just before the stop and not started: no new work once stopping.
            return Begin.RELEASE
        if ctx.cancel_requested:  # an operator cancelled it before its handler began
            if self.take(ctx):
                ctx.writing = Writing.WRITTEN
                self.events.lease_lost(ctx, "never started")
            return Begin.SKIP
        if self.on_job_start is not None:
            self.on_job_start(ctx.job)
        if self.tracer is not None:
            _tracing.start_run(self.tracer, ctx)
        return Begin.RUN

    def release(self, ctx: JobContext) -> None:
        self.recorder.release_or_keep(self.holdings.take([ctx]), "not started before the stop")

    def take(self, ctx: JobContext) -> bool:
        """Take the job's outcome, for this run alone to write (Holdings.take); False
        when it is taken already: released, or being, at a stop past its grace."""
        return bool(self.holdings.take([ctx]))

    def returned(
        self, ctx: JobContext, result: Result, started: float
    ) -> tuple[Result, Effect | AsyncEffect | None]:
        """The handler returned (or raised) `result`: note what goes with its outcome;
        the outcome and the effect transaction it opened, if any, for the caller to end.
        An attempt that ran past its task's timeout ends in TimeoutError whatever it
        returned: its supervisor (or its event loop) was about to end it, and its effect
        rolls back."""
        ctx.duration = time.monotonic() - started
        if result.succeeded and ctx.timeout and ctx.duration > ctx.timeout:
            result = executor.overran(ctx.task, ctx.job_id, ctx.timeout, None)
        ctx.result_json = result.value
        ctx.final_progress = progress.unwritten(ctx)  # written with the completion
        self.prefetch.observe_job(ctx.duration)  # threads race here: a lost sample
        _tracing.handler_raised(ctx, result.exception)
        return result, ctx.take_effect()

    def record(self, ctx: JobContext, task: Task[Any, Any] | None, result: Result) -> None:
        """A success goes to the completer's group commit; a snooze or a failure is
        written now."""
        if result.succeeded:
            # Queued first: the claim loop that returned() wakes takes it with its claim.
            self.completer.submit(ctx)  # group-committed, then recorded
            self.events.returned(ctx)
        elif result.snooze is not None:
            self.recorder.snooze(ctx, task, result)
        else:
            self.recorder.fail(ctx, task, result)
