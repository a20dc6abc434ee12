"""Inline mode and run_job: a job runs at once, in the test's own process and thread, as a
worker runs a claimed one (a real JobContext, the worker's call of the handler, its effect
ended with the outcome), and no job row is written.

The seam is the job store: App validates and builds each job as it always does, then
hands it to its producer's store, whose inserts here run the job instead (InlineStore).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Any, TypeVar, Unpack

import psycopg

from forklift import _job
from forklift._job import JobOptions, JobSpec
from forklift._producing import Producer
from forklift.app import App
from forklift.errors import ArgumentError, DatabaseError, JobNotFound, Snooze, UnknownTaskError
from forklift.store import AsyncEffect, ClaimedJob, Effect, JobStore, NewJob
from forklift.store._boundary import AsyncConn, Conn
from forklift.task import Task
from forklift.testing._effects import InlineAsyncEffect, InlineEffect
from forklift.testing._results import (
    FAILED,
    SNOOZED,
    SUCCEEDED,
    HandlerFailed,
    InlineUnsupported,
    Ran,
)
from forklift.testing._store import app_of
from forklift.workers import executor
from forklift.workers.context import AsyncJobContext, JobContext
from forklift.workers.executor import Result
from forklift.workers.worker import task_timeout

T = TypeVar("T")

OWNER = "inline"  # the owner an inline run is made by (the words of a worker's refusal)

# Inline jobs' ids: -1, -2, ... in this process. No job row has a negative id.
_numbers = itertools.count(1)


def next_id() -> int:
    return -next(_numbers)


class Inline:
    """What inline mode ran: `runs`, each job's one run (Ran), in the order they ended (a
    job enqueued by a handler ends before the job that enqueued it)."""

    def __init__(self) -> None:
        self.runs: list[Ran] = []

    def of(self, task: Task[Any, Any] | str) -> list[Ran]:
        """The runs of `task` (a task, or its name)."""
        name = task if isinstance(task, str) else task.name
        return [r for r in self.runs if r.task == name]

    def result(self, job_id: int) -> Any:
        """What job `job_id` returned (JSON, decoded, as app.result() gives it)."""
        for ran in self.runs:
            if ran.job_id == job_id:
                return ran.result
        raise JobNotFound(f"no job {job_id} ran inline")


@contextmanager
def inline(app: App, conn: Conn | AsyncConn | None = None) -> Iterator[Inline]:
    """`with forklift.testing.inline(app) as jobs:` every job `app` enqueues in the block
    (task.enqueue(), app.enqueue(), app.enqueue_many() and their async twins, from any
    thread) runs at once, before enqueue returns, in the thread that enqueues it
    (enqueue_async without `conn=` hands it to a thread, as it does its insert). Each
    is validated as always (ArgumentError, UnknownTaskError), runs with a real
    JobContext (an AsyncJobContext for an async def) and ends as a worker ends a run:
    what it returns is its result (JSON; `jobs.result(job_id)`, `jobs.runs`), and what
    it raises is raised to the caller of enqueue as HandlerFailed (the handler's
    exception its `__cause__`), so is a result that is not JSON.

    `conn`: a test's psycopg connection, which every `ctx.transaction()` joins (an
    AsyncConnection for async handlers): in the transaction the test has open, as a
    savepoint, so the test's rollback undoes every effect (`with conn.transaction(
    force_rollback=True):` around the block does it); a handler that raises has its
    blocks rolled back to their savepoint. With no transaction open, or with no `conn`
    (a connection of the handler's own, to the app's database), an effect commits when
    its handler returns. A handler that never calls `ctx.transaction()` needs no
    database at all.

    What inline mode does NOT do, so as not to mislead:

    - It writes no job row: nothing to claim, lease, renew or complete; the ids it
      returns are negative, and no query sees those jobs (`assert_enqueued`, `forklift
      jobs`). What needs a row is refused with InlineUnsupported: app.enqueue_batch(),
      app.batch(), app.result(), a workflow's enqueue() (test workflows with drain()).
      `ctx.batch` is None; `ctx.progress()` is kept, unseen.
    - One run per job: no retries, no backoff; forklift.Retry and forklift.Fail are
      failures like any exception (HandlerFailed). `ctx.attempt` is 1. A run that
      snoozes (forklift.Snooze, raised or returned) is no failure: it is kept as
      `snoozed` (Ran.snoozed_for: its seconds), its effect rolled back, and the job is
      not run again (no max_snoozes either).
    - No scheduling: `delay`, `run_at`, `priority` and `queue` are kept on the context
      but change nothing; jobs run in the order they are enqueued, depth first.
    - No limits (forklift.Limit), paused queues or max depth (QueueFull); an
      idempotency key is unique within the block only (a second job with it is not
      run, and gets the first one's id), not against the database.
    - The producer's own `conn=` (enqueue in your transaction) is ignored: the job
      runs at once, not after that transaction commits, and whether it commits or not.
    - No process, no timeout kill: a plain def handler runs to its end, and a run that
      took longer than its task's timeout fails with TimeoutError afterwards (a worker
      would kill it); an async def one is cancelled at its timeout, as on a worker.
    - `enqueue_many` runs its jobs one by one: one that raises stops the rest, and
      those before it have run (a worker's bulk insert is all or nothing).

    As a pytest fixture: `@pytest.fixture` `def jobs(): with inline(app) as ran: yield
    ran`. For the real claim, leases, retries and completion, use `drain()` on a real
    database.
    """
    runs = Inline()
    saved = app._producer  # forklift's own seam (batch.py uses it too), put back after
    app._producer = InlineProducer(app, Runner(app, conn, runs.runs).store)
    try:
        yield runs
    finally:
        app._producer = saved


def run_job(
    task: Task[Any, Any],
    args: Mapping[str, Any] | None = None,
    *,
    conn: Conn | AsyncConn | None = None,
    attempt: int = 1,
    **options: Unpack[JobOptions],
) -> Any:
    """Call `task`'s handler once with `args` and a real JobContext (no claim, no job
    row: as in inline mode, with its `conn`), and return its result as app.result()
    would give it (JSON, decoded: a tuple comes back a list). Raises HandlerFailed if it
    raised (or returned what is not JSON); a snooze (forklift.Snooze raised or returned)
    comes back as the forklift.Snooze, to assert on its `seconds`. `attempt`: the
    context's attempt (test the handler's last one with `attempt=task.max_attempts`);
    `options`: enqueue's, e.g. `idempotency_key`. For a pure handler test. An async def
    handler is run to its end on an event loop of its own (in a thread if one runs here
    already: for one that uses your AsyncConnection, `await task.enqueue_async(...)` in
    inline mode instead)."""
    app = app_of(task)
    job = _job.build(
        JobSpec(task.name, {} if args is None else args, **options), task, app.max_arg_bytes
    )
    if not 1 <= attempt <= job.max_attempts:
        raise ArgumentError(f"attempt must be between 1 and {job.max_attempts}, got {attempt}")
    ran = Runner(app, conn).run(job, next_id(), attempt)
    return ran.result if ran.snoozed_for is None else Snooze(ran.snoozed_for)


class Runner:
    """Runs jobs at once, in this process, as a worker runs a claimed one; keeps each
    run in `runs`. `conn`: what their effects join (None: a connection of their own)."""

    def __init__(
        self, app: App, conn: Conn | AsyncConn | None, runs: list[Ran] | None = None
    ) -> None:
        self.app = app
        self.conn = conn
        self.runs = [] if runs is None else runs
        self.store = InlineStore(self)
        self._keys: dict[str, int] = {}  # idempotency key -> the id of its job

    def enqueue(self, job: NewJob) -> int:
        """Run `job` now (unless its key ran already); its id."""
        known = self._keyed(job)
        return known if known is not None else self.run(job, next_id()).job_id

    async def enqueue_async(self, job: NewJob) -> int:
        known = self._keyed(job)
        return known if known is not None else (await self.run_async(job, next_id())).job_id

    def _keyed(self, job: NewJob) -> int | None:
        key = job.idempotency_key
        return None if key is None else self._keys.get(key)

    def run(self, job: NewJob, job_id: int, attempt: int = 1) -> Ran:
        task, ctx = self._context(job, job_id, attempt)
        if task.is_async:
            result = on_a_loop(lambda: self._run_async(task, ctx))
        else:
            result = self._run_sync(task, ctx)
        return self._ended(ctx, result)

    async def run_async(self, job: NewJob, job_id: int, attempt: int = 1) -> Ran:
        task, ctx = self._context(job, job_id, attempt)
        if task.is_async:
            result = await self._run_async(task, ctx)
        else:
            result = self._run_sync(task, ctx)
        return self._ended(ctx, result)

    def _context(self, job: NewJob, job_id: int, attempt: int) -> tuple[Task[Any, Any], JobContext]:
        """The job as a worker would hold it once claimed, and its context (as Worker._adopt
        makes it; no batch, no effect bounds: see InlineEffect)."""
        task = self.app.tasks.get(job.task)
        if task is None:
            raise UnknownTaskError(
                f"inline mode runs jobs at enqueue, and this app declares no task {job.task!r} "
                "to run (a producer-only app: test with the app that declares it)"
            )
        if job.idempotency_key is not None:
            self._keys[job.idempotency_key] = job_id
        claimed = ClaimedJob(
            job_id, job.queue, job.task, json.loads(job.args), job.idempotency_key,
            job.priority, attempt, job.max_attempts, job.timeout,
        )  # fmt: skip
        kind = AsyncJobContext if task.is_async else JobContext
        return task, kind(claimed, self.store, timeout=task_timeout(self.app, claimed))

    def _run_sync(self, task: Task[Any, Any], ctx: JobContext) -> Result:
        """The worker's run of a plain def handler (JobRuns._run_job, on this thread)."""
        started = time.monotonic()
        result = executor.run(task, ctx, OWNER)
        if result.succeeded and ctx.timeout and time.monotonic() - started > ctx.timeout:
            result = executor.overran(ctx.task, ctx.job_id, ctx.timeout, None)
        effect = ctx.take_effect()
        if effect is None:
            return result
        assert isinstance(effect, Effect)
        if not result.succeeded:
            with suppress(DatabaseError):  # the handler's failure is the one to tell
                effect.rollback()
            return result
        try:
            effect.commit_completing(ctx.job_id, ctx.attempt, OWNER, result.value)
        except DatabaseError as exc:
            return executor.failure(exc)
        return result

    async def _run_async(self, task: Task[Any, Any], ctx: JobContext) -> Result:
        """The worker's run of an async def handler (aio.py), on this event loop."""
        result = await executor.run_async(task, ctx, OWNER, ctx.timeout)
        effect = ctx.take_effect()
        if effect is None:
            return result
        assert isinstance(effect, AsyncEffect)
        if not result.succeeded:
            with suppress(DatabaseError):
                await effect.rollback()
            return result
        try:
            await effect.commit_completing(ctx.job_id, ctx.attempt, OWNER, result.value)
        except DatabaseError as exc:
            return executor.failure(exc)
        return result

    def _ended(self, ctx: JobContext, result: Result) -> Ran:
        """Keep the run; raise HandlerFailed if it failed (a snooze did not)."""
        if result.snooze is not None:
            ran = Ran(
                ctx.job_id, ctx.task, ctx.args, ctx.attempt, SNOOZED, snoozed_for=result.snooze
            )
            self.runs.append(ran)
            return ran
        ran = Ran(
            ctx.job_id, ctx.task, ctx.args, ctx.attempt, SUCCEEDED if result.succeeded else FAILED,
            result=None if result.value is None else json.loads(result.value),
            error=None if result.succeeded else result.error, traceback=result.traceback,
        )  # fmt: skip
        self.runs.append(ran)
        if isinstance(result.exception, KeyboardInterrupt):
            raise result.exception  # Ctrl-C stops the test run, not just this job
        if not result.succeeded:
            raise HandlerFailed(ran) from result.exception
        return ran

    def effect(self) -> Effect:
        """The effect transaction a plain def handler's first ctx.transaction() opens."""
        if self.conn is None:
            return InlineEffect.of_own(self.app.dsn)
        if isinstance(self.conn, psycopg.AsyncConnection):
            raise TypeError(
                "inline mode was given an AsyncConnection, and a plain def handler's "
                "ctx.transaction() needs a psycopg Connection"
            )
        return InlineEffect(self.conn, own=False)

    async def effect_async(self) -> AsyncEffect:
        """The effect transaction an async def handler's first ctx.transaction() opens."""
        if isinstance(self.conn, psycopg.Connection):
            raise TypeError(
                "inline mode was given a psycopg Connection, and an async def handler's "
                "`async with ctx.transaction()` needs an AsyncConnection"
            )
        return await InlineAsyncEffect.of(self.conn, self.app.dsn)


def on_a_loop(make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine to its end from plain code: on an event loop of its own, here; or,
    when a loop runs in this thread already (a plain enqueue from async code, which
    asyncio.run refuses), on a thread of its own, this one waiting as an enqueue would."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(make())
    with ThreadPoolExecutor(1, thread_name_prefix="forklift-inline") as pool:
        return pool.submit(lambda: asyncio.run(make())).result()


class InlineStore(JobStore):
    """The job store inline mode puts behind its app's producer and its jobs' contexts:
    an insert runs the job (Runner), an effect transaction opens where the Runner says.
    Every other statement needs a job row, which inline mode never writes: asking for
    any other part of the store raises InlineUnsupported, naming it."""

    def __init__(self, runner: Runner) -> None:
        # Not JobStore.__init__: no pool and no queries, so that nothing else can run.
        self._runner = runner

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise InlineUnsupported(
            f"inline mode writes no job rows, and this needs the job store's {name!r} "
            "(batches, app.result() and the like do): test it on a real database, "
            "with forklift.testing.drain()"
        )

    def job_insert(
        self, job: NewJob, conn: Conn | None = None, *, wait: float | None = None
    ) -> int:
        return self._runner.enqueue(job)

    async def job_insert_async(self, job: NewJob, conn: AsyncConn) -> int:
        return await self._runner.enqueue_async(job)

    def job_insert_many(
        self,
        jobs: Iterable[NewJob],
        conn: Conn | None = None,
        *,
        count: int | None = None,
        wait: float | None = None,
        each: Callable[[], None] | None = None,
    ) -> list[int]:
        return [self._runner.enqueue(job) for job in jobs]

    async def job_insert_many_async(self, jobs: Sequence[NewJob], conn: AsyncConn) -> list[int]:
        return [await self._runner.enqueue_async(job) for job in jobs]

    def effect_begin(
        self, idle_limit: float | None = None, statement_limit: float | None = None
    ) -> Effect:
        return self._runner.effect()

    async def effect_begin_async(
        self, idle_limit: float | None = None, statement_limit: float | None = None
    ) -> AsyncEffect:
        return await self._runner.effect_async()


class InlineProducer(Producer):
    """An App's producer in inline mode: its store is the InlineStore, and it holds no
    pool (the App's own producer, put back after the block, is left as it was)."""

    def __init__(self, app: App, store: InlineStore) -> None:
        super().__init__(app)
        self._inline = store

    def store(self, wait: float | None = None) -> JobStore:
        return self._inline

    def close(self) -> None:
        """Nothing to close."""
