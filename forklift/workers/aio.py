"""The worker's event loop: async def handlers, up to --concurrency at once, on one
asyncio loop in a thread of its own, beside the executor threads' plain def handlers.

A job goes the same way as on an executor thread (runs.py's `begin`, `returned`,
`record`): the same leases (renewed by the renewer's thread, never by the loop), fences,
results, progress and crash charging. What differs, and why:

- Its effect transaction is an AsyncConnection (`async with ctx.transaction()`), from
  the worker's async pool, committed with its completion on the loop
  (`Recorder.commit_effect_async`). A failed attempt, a release and a batch's end are
  written on a thread (`_off_loop`): the worker's own connection is a sync one, and no
  handler waits for it.
- Its timeout is the loop's: at the task's timeout the coroutine is cancelled and the
  attempt ends in a TimeoutError, worded as the supervisor words a sync one, with no
  kill of the process and the other jobs in it. The supervisor still times it, with
  ASYNC_TIMEOUT_GRACE more (supervisor/boot.py): its kill is the backstop for a loop
  blocked past that.
- A cancel (an operator's, a lost lease, a stop past its grace) turns `ctx.cancelled`
  true and wakes `await ctx.wait_cancelled()` at once; a handler still running
  CANCEL_AFTER seconds later is cancelled (CancelledError at its next await).
- A handler that blocks the loop (time.sleep, CPU work, a sync driver) holds up every
  other async handler: their awaits, timers and timeouts resume only when it returns
  to the loop. Leases are renewed meanwhile (their thread is not the loop's), so
  nothing is charged for it; `LoopWatch` logs `worker.loop_blocked` naming the job on
  the loop once it has not answered for LOOP_BLOCKED seconds, and
  `worker.loop_unblocked` with how long, when it does.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from forklift import _tracing
from forklift._events import emit
from forklift.app import App
from forklift.errors import DatabaseError
from forklift.store import AsyncEffect, Effect
from forklift.task import Task
from forklift.workers import executor
from forklift.workers.connections import AsyncEffects
from forklift.workers.context import AsyncJobContext, JobContext
from forklift.workers.events import JobEvents, Outcome
from forklift.workers.executor import Result
from forklift.workers.recorder import Recorder

log = logging.getLogger("forklift.workers.worker")

T = TypeVar("T")

CANCEL_AFTER = 1.0  # seconds from a cancel to the CancelledError of a handler still running
LOOP_BLOCKED = 1.0  # seconds the loop may not answer before it is said to be blocked
WATCH_EVERY = 0.25  # seconds between the watch's pings of the loop
STOP_WAIT = 2.0  # seconds the stop waits for cancelled handlers to clean up


class Begin(enum.Enum):
    """What becomes of a job taken from the queue, before its handler runs."""

    RUN = "run"
    SKIP = "skip"  # not ours to run (released, cancelled): already dealt with
    RELEASE = "release"  # claimed before the stop, not started: release it


class JobSteps(Protocol):
    """The steps around one handler's call, the same for a thread and the loop (worker.py)."""

    def begin(self, ctx: JobContext) -> Begin: ...

    def returned(
        self, ctx: JobContext, result: Result, started: float
    ) -> tuple[Result, Effect | AsyncEffect | None]: ...

    def take(self, ctx: JobContext) -> bool: ...

    def record(self, ctx: JobContext, task: Task[Any, Any] | None, result: Result) -> None: ...

    def release(self, ctx: JobContext) -> None: ...


class AsyncRunner:
    """The event loop thread of one worker, started with its first async job."""

    def __init__(
        self,
        app: App,
        owner: str,
        steps: JobSteps,
        recorder: Recorder,
        events: JobEvents,
        effects: AsyncEffects,
    ) -> None:
        self.app = app
        self.owner = owner
        self.steps = steps
        self.recorder = recorder
        self.events = events
        self.effects = effects
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._watch: LoopWatch | None = None
        self._lock = threading.Lock()
        self._tasks: dict[int, asyncio.Task[None]] = {}  # job id -> its task (loop only)
        self._in_handler: set[int] = set()  # jobs whose handler runs now (loop only)
        self._writes: ThreadPoolExecutor | None = None  # _off_loop's threads, lazily

    # -- from any thread -----------------------------------------------------------------

    def submit(self, contexts: Sequence[AsyncJobContext]) -> None:
        """Run the jobs on the loop (started now with the first): one wake-up of the loop
        for a claim's jobs, not one each."""
        loop = self.loop or self._start()
        for ctx in contexts:
            ctx.on_cancel = functools.partial(self._cancelled, loop, ctx)
        loop.call_soon_threadsafe(self._spawn, contexts)

    def stop(self) -> None:
        """Cancel what still runs (the worker released it), close the async pool, end
        the loop."""
        loop, thread = self.loop, self._thread
        if loop is None or thread is None:
            return
        if self._watch is not None:
            self._watch.stop()
        with contextlib.suppress(Exception):
            done = asyncio.run_coroutine_threadsafe(self._close(), loop)
            done.result(timeout=STOP_WAIT + 3.0)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=5.0)
        if self._writes is not None:
            self._writes.shutdown(wait=False)

    def _start(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self.loop is None:
                loop = asyncio.new_event_loop()
                self._thread = threading.Thread(
                    target=self._run_loop, args=(loop,), name="forklift-aio", daemon=True
                )
                self._thread.start()
                self._watch = LoopWatch(loop, self._on_loop_now)
                self._watch.start()
                self.loop = loop
            return self.loop

    def _run_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_forever()
        finally:
            with contextlib.suppress(Exception):
                loop.run_until_complete(loop.shutdown_default_executor())
            loop.close()

    def _cancelled(self, loop: asyncio.AbstractEventLoop, ctx: AsyncJobContext) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the worker is gone
            loop.call_soon_threadsafe(self._cancel_soon, ctx)

    def _on_loop_now(self) -> str | None:
        """The job whose handler holds the loop now (`task#id`), for the watch's log."""
        loop = self.loop
        task = asyncio.current_task(loop) if loop is not None else None
        return task.get_name() if task is not None else None

    # -- on the loop -----------------------------------------------------------------------

    def _spawn(self, contexts: Sequence[AsyncJobContext]) -> None:
        assert self.loop is not None
        for ctx in contexts:
            task = self.loop.create_task(self._run(ctx), name=f"{ctx.task}#{ctx.job_id}")
            self._tasks[ctx.job_id] = task

    def _cancel_soon(self, ctx: AsyncJobContext) -> None:
        ctx.woken()
        task = self._tasks.get(ctx.job_id)
        if task is not None and self.loop is not None:
            self.loop.call_later(CANCEL_AFTER, self._cancel_handler, ctx.job_id, task)

    def _cancel_handler(self, job_id: int, task: asyncio.Task[None]) -> None:
        if job_id in self._in_handler and not task.done():
            task.cancel()  # caught in executor.run_async: the attempt's outcome is refused

    async def _run(self, ctx: AsyncJobContext) -> None:
        try:
            await self._run_job(ctx)
        except Exception:  # never lose a slot: a bug here must not stall capacity
            log.exception("internal error while running job %s", ctx.job_id)
            self.events.end(ctx, Outcome.ERROR)
        finally:
            self._tasks.pop(ctx.job_id, None)

    async def _run_job(self, ctx: AsyncJobContext) -> None:
        begin = self.steps.begin(ctx)
        if begin is Begin.RELEASE:
            await self._off_loop(self.steps.release, ctx)
        if begin is not Begin.RUN:
            return
        task = self.app.tasks.get(ctx.task)
        token = _tracing.activate(ctx)
        started = time.monotonic()
        self._in_handler.add(ctx.job_id)
        try:
            result = await executor.run_async(task, ctx, self.owner, ctx.timeout)
        finally:
            self._in_handler.discard(ctx.job_id)
            _tracing.deactivate(token)
        result, effect = self.steps.returned(ctx, result, started)
        assert effect is None or isinstance(effect, AsyncEffect)
        if not self.steps.take(ctx):  # released (or being) at a stop past its grace
            if effect is not None:
                with contextlib.suppress(DatabaseError):
                    await effect.rollback()
            return
        if effect is not None:
            if not result.succeeded:
                await effect.rollback()
            elif (failed := await self.recorder.commit_effect_async(ctx, effect)) is None:
                return
            else:
                result = failed
        if result.succeeded:
            self.steps.record(ctx, task, result)  # queued for the completer: no I/O here
        else:
            await self._off_loop(self.steps.record, ctx, task, result)

    async def _off_loop(self, fn: Callable[..., T], *args: Any) -> T:
        """Run a blocking write (the worker's own connection) on a thread."""
        if self._writes is None:
            self._writes = ThreadPoolExecutor(2, "forklift-aio-write")
        assert self.loop is not None
        return await self.loop.run_in_executor(self._writes, functools.partial(fn, *args))

    async def _close(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=STOP_WAIT)
        await self.effects.close()


class LoopWatch:
    """Pings the loop from a thread; says when it stops answering (a handler blocks it)
    and when it answers again."""

    def __init__(self, loop: asyncio.AbstractEventLoop, on_loop: Callable[[], str | None]) -> None:
        self.loop = loop
        self.on_loop = on_loop
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._run, name="forklift-aio-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._closing.set()

    def _run(self) -> None:
        while not self._closing.wait(WATCH_EVERY):
            answered = threading.Event()
            asked = time.monotonic()
            try:
                self.loop.call_soon_threadsafe(answered.set)
            except RuntimeError:
                return  # the loop is closed
            if answered.wait(LOOP_BLOCKED):
                continue
            job = self.on_loop()
            emit(
                log, "worker.loop_blocked", logging.WARNING, job=job or "?",
                seconds=LOOP_BLOCKED,
                effect="other async handlers' awaits, timers and timeouts wait; leases are renewed",
            )  # fmt: skip
            while not answered.wait(0.5):
                if self._closing.is_set():
                    return
            blocked = time.monotonic() - asked
            emit(log, "worker.loop_unblocked", job=job or "?", blocked_for=round(blocked, 3))
