"""JobContext: what a handler knows about its job, and the transaction its effect joins."""

from __future__ import annotations

import asyncio
import enum
import functools
import inspect
import os
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    asynccontextmanager,
    contextmanager,
    suppress,
)
from types import TracebackType
from typing import TYPE_CHECKING, Any

import psycopg

from forklift._json import MAX_RESULT_BYTES
from forklift.errors import DatabaseError
from forklift.store import AsyncEffect, ClaimedJob, Effect, JobStore, NewJob
from forklift.workers import checkpoints, loops
from forklift.workers import upstream as upstreams

if TYPE_CHECKING:
    from forklift.batch import Batch

Reads = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]

# What ctx.progress() keeps of a message, in characters.
PROGRESS_MESSAGE_CHARS = 200

_EVENT_LOCK = threading.Lock()


class Stage(enum.Enum):
    """Where a held job is on its way through a slot (Holdings)."""

    WAITING = "waiting"  # claimed, its handler not called yet: it takes a slot
    PASSED = "passed"  # an executor passed it over, taken to be released: it takes a slot
    RUNNING = "running"  # its handler was called and has not returned: it takes a slot
    RAN = "ran"  # its handler returned (or it ended while it ran): its slot is free
    UNRUN = "unrun"  # it ended, or was released, before its handler was called


class Writing(enum.Enum):
    """Who writes a held job's outcome (its success, failure or release): the one
    thread that took it (Holdings.take), and no other."""

    NONE = "none"  # not taken yet: a lease found gone now is a lease lost
    TAKEN = "taken"  # taken by the thread writing it; its lease is still renewed
    WRITTEN = "written"  # written (or refused): about to be forgotten, not renewed


def storable(text: str) -> str:
    """`text` with what PostgreSQL's text and jsonb cannot hold escaped: a NUL as
    `\\x00`, a lone surrogate as `\\udcff` (backslashreplace). Plain ASCII without a NUL,
    nearly every message, is returned as it is after two cheap checks."""
    if text.isascii() and "\x00" not in text:
        return text
    text = text.replace("\x00", "\\x00")
    if text.isascii():
        return text
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _fresh_lock_after_fork() -> None:
    # A lock held by some thread at fork() would stay held forever in the child.
    global _EVENT_LOCK
    _EVENT_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_fresh_lock_after_fork)


def _checked_progress(
    done: float, total: float | None, message: str | None
) -> tuple[float, float | None, str | None]:
    numbers = (done, 0 if total is None else total)
    if not all(isinstance(n, int | float) and not isinstance(n, bool) for n in numbers):
        raise TypeError("ctx.progress(done, total=None, message=None): numbers, please")
    text = None if message is None else storable(str(message)[:PROGRESS_MESSAGE_CHARS])
    return done, total, text


class JobContext:
    """Passed to every handler as its first argument.

    `cancelled` becomes True when the job should stop early: it was cancelled, its lease
    was lost, or the worker is stopping past its grace. A long handler may poll it
    (`while not ctx.cancelled: ...`) or sleep with `ctx.wait_cancelled(seconds)`.
    `transaction()` yields a connection in an open transaction that stays open until the
    handler returns; the job's completion commits in that same transaction, so the
    effect commits exactly when the job does.

    An `async def` handler gets an AsyncJobContext: the same, with `await
    ctx.wait_cancelled(seconds)` and `async with ctx.transaction() as conn` (a psycopg
    AsyncConnection).
    """

    runs_async = False  # its handler is an async def, run on the worker's event loop

    def __init__(
        self,
        job: ClaimedJob,
        store: JobStore,
        *,
        effect_idle: float = 3600.0,
        effect_statement: float = 300.0,
        batch_of: Callable[[int, Reads], Batch] | None = None,
        build_job: Callable[..., NewJob] | None = None,
        timeout: float | None = None,
        owner: str = "",
        max_bytes: int = MAX_RESULT_BYTES,
        checkpoint_every: float = checkpoints.EVERY,
    ) -> None:
        self.job = job
        self.owner = owner  # the worker that holds its lease
        self.max_bytes = max_bytes  # the cap of its result, checkpoint and steps' results
        self.checkpoint_every = checkpoint_every  # seconds between written checkpoints
        self._resumable: checkpoints.Resumable | None = None  # made on first use
        self._depth = 0  # effect blocks open around the handler's code now
        self._stopping = False  # the worker is stopping: ctx.iterate ends at its next item
        self.timeout = timeout  # seconds its handler may run (the task's, else the row's)
        self._batch_of = batch_of
        self._build_job = build_job  # builds a step ctx.workflow.add() adds (App._new_job)
        self._upstream: upstreams.Upstream | None = None  # read on first use
        self.effect_idle = effect_idle  # seconds its effect transaction may sit idle
        self.effect_statement = effect_statement  # seconds one statement in it may take
        self._cancelled = False
        self._woken: threading.Event | None = None  # made only for wait_cancelled()
        self.duration = 0.0
        # The worker's bookkeeping (see Holdings for its lock): where the job is on its
        # way through a slot, and who writes its outcome.
        self.stage = Stage.WAITING
        self.started_at = 0.0  # when its handler was called (time.monotonic())
        self.writing = Writing.NONE
        self.cancel_requested = False  # an operator cancelled it (forklift jobs cancel)
        # Told True as its handler's call begins and False as it ends (a supervisor's
        # child marks it where its supervisor reads it after a death: running.py).
        self.on_handler: Callable[[bool], None] | None = None
        self.result_json: str | None = None  # what the handler returned, as JSON
        self.final_progress: str | None = None  # its progress to write with the completion
        # The latest ctx.progress() (done, total, message), and whether it is written yet.
        self.progress_now: tuple[float, float | None, str | None] | None = None
        self.progress_dirty = False
        self._store = store
        self._effect: Effect | AsyncEffect | None = None
        # Tracing (_tracing.py): the enqueue's W3C context, and this attempt's run span.
        self.trace_context: dict[str, str] | None = None
        self.span: Any = None

    @property
    def started(self) -> bool:
        """Whether its handler was called (on_job_start told)."""
        return self.stage is Stage.RUNNING or self.stage is Stage.RAN

    @property
    def cancelled(self) -> bool:
        """True once the job should stop early: cancelled, lease lost, or stopping."""
        return self._cancelled

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to `timeout` seconds, waking at once if the job is cancelled meanwhile;
        return whether it is cancelled. For handlers that wait (poll an API, back off)."""
        # The Event is made on first use: most handlers never wait, and one per job costs.
        with _EVENT_LOCK:
            if self._cancelled:
                return True
            if self._woken is None:
                self._woken = threading.Event()
            woken = self._woken
        woken.wait(max(0.0, timeout))
        return self._cancelled

    @property
    def stopping(self) -> bool:
        """True once the worker is stopping (SIGTERM, a deploy): a resumable loop ends at
        its next item (ctx.iterate does), checkpointed, and the job is given back."""
        return self._stopping

    def stop(self) -> None:
        """Tell the handler its worker is stopping (the worker calls this)."""
        self._stopping = True

    def cancel(self) -> None:
        """Tell the handler to stop (the worker calls this; the handler only reads)."""
        with _EVENT_LOCK:
            self._cancelled = True
            woken = self._woken
        if woken is not None:
            woken.set()

    def progress(self, done: float, total: float | None = None, message: str | None = None) -> None:
        """Record how far the job is (`done` of `total`, a short `message`). Cheap to call
        in a tight loop: the worker writes the latest one at most twice a second, on a
        thread of its own, never in the effect transaction. Shown by `forklift jobs
        show`, `top`, and summed per batch by `forklift batches show`. A message
        is kept as given, except what PostgreSQL cannot store (a NUL, or a lone
        surrogate such as a surrogateescape'd file name holds), which is written as
        its escape (`\\x00`, `\\udcff`): a report never fails its job."""
        kind, of = type(done), type(total)
        if (kind is int or kind is float) and (of is int or of is float or total is None):
            # The tight loop's path: plain numbers, no more checks.
            text = None if message is None else storable(str(message)[:PROGRESS_MESSAGE_CHARS])
            self.progress_now = (done, total, text)
        else:
            self.progress_now = _checked_progress(done, total, message)
        self.progress_dirty = True

    @property
    def batch(self) -> Batch | None:
        """The batch this job belongs to, or, for a batch's callback, the batch it
        finishes (its status, results and dead jobs); None for any other job."""
        from forklift.batch import callback_of

        batch_id = self.job.batch_id or callback_of(self.job.idempotency_key)
        if batch_id is None or self._batch_of is None:
            return None
        return self._batch_of(batch_id, self._reads)

    @property
    def upstream(self) -> upstreams.Upstream:
        """A workflow step's upstream jobs: `ctx.upstream["extract"]` is the result of
        the step named so (workers/upstream.py). Empty for a job of no workflow."""
        if self._upstream is None:
            found = self.job.workflow_id and upstreams.load(self.job.id, self._store, self._reads)
            self._upstream = found or upstreams.Upstream([])
        return self._upstream

    @functools.cached_property
    def workflow(self) -> upstreams.StepWorkflow | None:
        """The workflow this job is a step of (its id, name, `context`, and `add()`, which
        grows it), or None."""
        parent = upstreams.Parent(self.job.id, self.owner, self.job.attempt, self._reads)
        found = self.job.workflow_id and upstreams.workflow(parent, self._store, self._build_job)
        return found or None

    @contextmanager
    def _reads(self) -> Iterator[psycopg.Connection[Any]]:
        """Where the handler's reads of its batch go: into its effect transaction while
        one is open (the handler holds that connection), else an effects connection."""
        if isinstance(self._effect, Effect):
            yield self._effect.conn
            return
        pool = self._store.effects if self._store.effects is not None else self._store.pool
        with pool.connection() as conn:
            yield conn

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def args(self) -> dict[str, Any]:
        return self.job.args

    @property
    def idempotency_key(self) -> str | None:
        return self.job.idempotency_key

    @property
    def task(self) -> str:
        return self.job.task

    @property
    def queue(self) -> str:
        return self.job.queue

    # -- resuming (workers/checkpoints.py) ------------------------------------------------

    def resumable(self) -> checkpoints.Resumable:
        """This attempt's checkpoint, read on first use."""
        if self._resumable is None:
            self._resumable = checkpoints.Resumable(self, self._store, self.owner)
        return self._resumable

    @property
    def checkpointed(self) -> Any:
        """The state of the last `checkpoint()` of this job (an earlier attempt's, or this
        one's), or None: the job starts from the beginning."""
        return self.resumable().state()

    def checkpoint(self, state: Any, *, flush: bool = False) -> None:
        """Save `state` (JSON, capped like a result) for the next attempt, fenced by this
        attempt's lease. Inside `ctx.transaction()` it commits with the block's effect
        when the outermost block ends; outside, it is written within `checkpoint_every`
        seconds, or at once with `flush=True` (LeaseLost: the job is not ours any more)."""
        value = checkpoints.checked(state, self.max_bytes, "a checkpoint")
        self.resumable().change(checkpoints.STATE, "", value, urgent=True)
        checkpoints.reached(self, flush=flush)

    def iterate(
        self,
        source: Sequence[Any] | Callable[[Any], Sequence[Any]],
        *,
        cursor: Callable[[Any], Any] | None = None,
        name: str = "iterate",
    ) -> loops.Loop:
        """Loop over `source` (`for`; `async for` in an async handler), resuming after
        the last item a previous attempt finished: a range or a sequence (the cursor is
        the index), or a callable `fetch(cursor) -> page` (keyset pagination:
        `cursor(item)` is an item's cursor, the item itself by default; None asks for
        the first page; an empty page ends). An item is done when its loop body
        finishes: its cursor is written every `checkpoint_every` seconds, or commits
        with the effect transaction the body opened. Once the worker is stopping, the
        loop ends at the next item with `forklift.Interrupted`: the job is given back,
        its attempt not counted. A second loop in one job needs a `name` of its own."""
        return loops.Loop(self, source, cursor, name)

    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Run `fn(*args, **kwargs)` once per job across attempts: done before, its
        recorded result is returned and `fn` is not called. The result (JSON, capped like
        a job's) is recorded as `fn` returns, with the effect transaction `fn` opened if
        any (so its effect commits once), else on a connection of its own."""
        done, value = self.resumable().step(name)
        if not done:
            value = checkpoints.done(self, name, fn(*args, **kwargs))
            checkpoints.reached(self, flush=True)
        return value

    def ran_for(self) -> float:
        """Seconds its handler has run in this attempt (0 before it starts)."""
        return time.monotonic() - self.started_at if self.started_at else 0.0

    def transaction(self) -> EffectBlock:
        """A connection inside the job's effect transaction, like psycopg's
        `conn.transaction()`: an exception leaving the block undoes the block's writes,
        whether or not the handler catches it; the writes of blocks that end normally
        commit with the job's completion. `with` it in a plain def handler (a psycopg
        Connection); `async with` it in an async def one (an AsyncConnection).

        Leaving the block does not commit: the worker commits after the handler returns,
        together with the job's completion. If the handler raises, every block rolls
        back and the job fails like any other.
        """
        return EffectBlock(self)

    def take_effect(self) -> Effect | AsyncEffect | None:
        """The effect transaction the handler opened, if any, for the worker to end."""
        effect, self._effect = self._effect, None
        return effect


@contextmanager
def _sync_block(ctx: JobContext) -> Iterator[psycopg.Connection[Any]]:
    if ctx.runs_async:
        raise TypeError(
            "an async handler's effect transaction is `async with ctx.transaction() "
            "as conn:` (a plain `with` would block the event loop)"
        )
    if isinstance(ctx._effect, Effect):
        with ctx._effect.conn.transaction():  # a savepoint: undoes only this block
            yield ctx._effect.conn
        return
    # The first block opens the transaction, and nothing is in it before the block:
    # rolling all of it back undoes just the block, without a savepoint's round trips
    # on every job. A later block opens a fresh one.
    effect = ctx._effect = ctx._store.effect_begin(
        idle_limit=ctx.effect_idle, statement_limit=ctx.effect_statement
    )
    try:
        yield effect.conn
    except BaseException:
        ctx._effect = None
        with suppress(DatabaseError):  # the block's own error is the one to raise
            effect.rollback()
        raise


@asynccontextmanager
async def _async_block(ctx: JobContext) -> AsyncIterator[psycopg.AsyncConnection[Any]]:
    if not ctx.runs_async:
        raise TypeError(
            "`async with ctx.transaction()` is for async def handlers; a plain def "
            "handler's is `with ctx.transaction() as conn:`"
        )
    if isinstance(ctx._effect, AsyncEffect):
        async with ctx._effect.conn.transaction():  # a savepoint, as above
            yield ctx._effect.conn
        return
    effect = ctx._effect = await ctx._store.effect_begin_async(
        idle_limit=ctx.effect_idle, statement_limit=ctx.effect_statement
    )
    try:
        yield effect.conn
    except BaseException:
        ctx._effect = None
        with suppress(DatabaseError):
            await effect.rollback()
        raise


class EffectBlock:
    """What `ctx.transaction()` returns: a block of the job's effect transaction, entered
    with `with` (a plain def handler) or `async with` (an async def one)."""

    def __init__(self, ctx: JobContext) -> None:
        self._ctx = ctx
        self._block: AbstractContextManager[psycopg.Connection[Any]] | None = None
        self._async_block: AbstractAsyncContextManager[psycopg.AsyncConnection[Any]] | None = None

    def __enter__(self) -> psycopg.Connection[Any]:
        self._block = _sync_block(self._ctx)
        conn = self._block.__enter__()
        self._ctx._depth += 1
        return conn

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._block is not None
        ctx = self._ctx
        ctx._depth -= 1
        try:
            handled = self._block.__exit__(kind, exc, tb)
        except BaseException:
            self._ended(False)
            raise
        resumable = self._ended(kind is None)
        if resumable is not None and isinstance(ctx._effect, Effect):
            resumable.commit(ctx._effect)  # a checkpoint made inside commits with it
        return handled

    async def __aenter__(self) -> psycopg.AsyncConnection[Any]:
        self._async_block = _async_block(self._ctx)
        conn = await self._async_block.__aenter__()
        self._ctx._depth += 1
        return conn

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        assert self._async_block is not None
        ctx = self._ctx
        ctx._depth -= 1
        try:
            handled = await self._async_block.__aexit__(kind, exc, tb)
        except BaseException:
            self._ended(False)
            raise
        resumable = self._ended(kind is None)
        if resumable is not None and isinstance(ctx._effect, AsyncEffect):
            await resumable.commit_async(ctx._effect)
        return handled

    def _ended(self, ok: bool) -> checkpoints.Resumable | None:
        """The block ended: what was checkpointed in a block that rolled back is
        forgotten; the checkpoint to commit now, if the outermost block ended well with
        one due."""
        ctx = self._ctx
        resumable = ctx._resumable
        if resumable is None:
            return None
        if not ok:
            if ctx._effect is None:
                resumable.rolled_back()
            else:
                resumable.dropped(ctx._depth + 1)
            return None
        # Only an explicit checkpoint or a step: a loop's cursor waits for its item's end
        # (the boundary), or the body's rows would commit with the cursor before them.
        return resumable if ctx._depth == 0 and resumable.urgent else None


class AsyncJobContext(JobContext):
    """An async def handler's JobContext: `await ctx.wait_cancelled(seconds)` and `async
    with ctx.transaction() as conn` (a psycopg AsyncConnection); the rest as JobContext.

    When the job is cancelled, its lease lost or the worker stopping past its grace,
    `cancelled` turns True and `wait_cancelled` returns at once; a coroutine still
    running a moment later is cancelled too (CancelledError at its next await: see
    workers/aio.py), so the supervisor need not kill the process and its other jobs.
    """

    runs_async = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._async_woken: asyncio.Event | None = None  # made on the loop, on first wait
        self.on_cancel: Callable[[], None] | None = None  # the event loop's (aio.py)

    async def wait_cancelled(self, timeout: float) -> bool:  # type: ignore[override]
        """Sleep up to `timeout` seconds without blocking the event loop, waking at once
        if the job is cancelled meanwhile; return whether it is cancelled."""
        with _EVENT_LOCK:
            if self._cancelled:
                return True
            if self._async_woken is None:
                self._async_woken = asyncio.Event()
            woken = self._async_woken
        with suppress(TimeoutError):
            async with asyncio.timeout(max(0.0, timeout)):
                await woken.wait()
        return self._cancelled

    async def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`await ctx.step(name, fn, *args)`: JobContext.step, `fn` a plain or an async
        def; its result commits with the effect transaction it opened, if any."""
        done, value = self.resumable().step(name)
        if done:
            return value
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        value = checkpoints.done(self, name, value)
        if not self._depth:
            if isinstance(self._effect, AsyncEffect):
                await self.resumable().commit_async(self._effect)
            else:
                await asyncio.to_thread(self.resumable().flush)
        return value

    def cancel(self) -> None:
        super().cancel()
        if self.on_cancel is not None:
            self.on_cancel()  # wakes wait_cancelled and cancels the coroutine, on the loop

    def woken(self) -> None:
        """On the event loop, after cancel(): wake a wait_cancelled()."""
        with _EVENT_LOCK:
            woken = self._async_woken
        if woken is not None:
            woken.set()
