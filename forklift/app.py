"""App: configuration, the task registry and the producer API."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, ParamSpec, TypeVar, Unpack, cast, overload

import psycopg

from forklift import (
    _config,
    _db,
    _job,
    _json,
    _names,
    _producing,
    _singleton,
    _sql,
    _waiting,
    batch,
    devdb,
    workflow,
)
from forklift._job import JobOptions as JobOptions
from forklift._job import JobSpec as JobSpec
from forklift.batch import Batch
from forklift.errors import ArgumentError, ConfigError, UnknownTaskError
from forklift.scheduler import declare
from forklift.scheduler.schedule import Schedule
from forklift.store import JobStore, NewJob, short_connection
from forklift.store.batches import BatchStore
from forklift.task import Task, TaskOptions
from forklift.workflow import Link, Workflow

P = ParamSpec("P")
R = TypeVar("R")

MAX_RESULT_BYTES = _json.MAX_RESULT_BYTES
MAX_ARG_BYTES = _job.MAX_ARG_BYTES


def _check_new_task(
    tasks: Mapping[str, Task[Any, Any]], name: str, queue: str, fn: Callable[..., Any]
) -> None:
    """Refuse a task declared with a bad name or queue, or a name the app has already."""
    try:
        _names.check("task", name)
        _names.check("queue", queue)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if name in tasks:
        other = tasks[name].fn
        raise ConfigError(
            f"two tasks are named {name!r} in this app "
            f"({other.__module__}.{other.__qualname__} and "
            f"{fn.__module__}.{fn.__qualname__}): give one of them name=..."
        )


def _task_for_enqueue(tasks: Mapping[str, Task[Any, Any]], name: str) -> Task[Any, Any] | None:
    """The registered task `name`; None for a producer-only app (no tasks), which may
    enqueue any well-formed name for workers elsewhere."""
    if type(name) is str and (found := tasks.get(name)) is not None:
        return found  # declared, so its name was checked then
    try:
        _names.check("task", name)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    task = tasks.get(name)
    if task is None and tasks:
        close = difflib.get_close_matches(name, list(tasks), n=3, cutoff=0.6)
        hint = f"; did you mean {' or '.join(map(repr, close))}?" if close else ""
        raise UnknownTaskError(
            f"no task named {name!r} in this app{hint} (an App with no tasks "
            "registered may enqueue any name, for workers that define it)"
        )
    return task


def _built(
    tasks: Mapping[str, Task[Any, Any]],
    specs: Iterable[JobSpec | tuple[str, Mapping[str, Any]]],
    max_arg_bytes: int,
) -> Iterator[NewJob]:
    """Each job of `specs` validated (_job.build) as it is taken."""
    for spec in specs:
        if isinstance(spec, tuple):
            if len(spec) != 2:
                raise ArgumentError(f"a job as a tuple is (task name, args), got {spec!r}")
            spec = JobSpec(*spec)
        if isinstance(spec, JobSpec):
            yield _job.build(spec, _task_for_enqueue(tasks, spec.task), max_arg_bytes)
        else:
            raise ArgumentError(
                "each job is a forklift.JobSpec or a (task name, args) tuple, got "
                f"{type(spec).__name__} {spec!r:.60}"
            )


def _max_arg_bytes(given: int | None) -> int:
    """How big a job's arguments may be, as JSON: App(max_arg_bytes=...), else
    FORKLIFT_MAX_ARG_BYTES, else 1 MiB. Bigger ones are refused at enqueue with an
    ArgumentError, whichever way they are enqueued."""
    value = (
        given
        if given is not None
        else _config.env("MAX_ARG_BYTES", _config.positive_int, MAX_ARG_BYTES)
    )
    if value < 1:
        raise ConfigError(f"max_arg_bytes must be >= 1, got {value}")
    return value


def _checked_name(kind: str, name: str) -> None:
    try:
        _names.check(kind, name)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None


def _migrate(dsn: str, schema: str) -> list[int]:
    from forklift.schema import migrate

    timeouts = _db.Timeouts(statement=60.0, lock=30.0)
    with short_connection(dsn, timeouts, "forklift-migrate", "migrate") as conn:
        return migrate(conn, schema)


class App:
    """A forklift application: where the database is, and which tasks exist.

    Creating an App opens nothing: connections are made on first use, in the process
    that uses them, so an App can be imported before a fork.
    """

    def __init__(
        self,
        dsn: str | None = None,
        *,
        schema: str | None = None,
        max_result_bytes: int = MAX_RESULT_BYTES,
        max_arg_bytes: int | None = None,
        enqueue_timeout: float = _producing.ENQUEUE_TIMEOUT,
    ) -> None:
        if max_result_bytes < 1:
            raise ConfigError(f"max_result_bytes must be >= 1, got {max_result_bytes}")
        self.enqueue_timeout = _producing.seconds(enqueue_timeout)
        self._dsn = dsn
        self.max_arg_bytes = _max_arg_bytes(max_arg_bytes)
        # A handler's return value, as JSON, may be this big; a bigger one ends the job
        # dead with a ResultError (it would not shrink on a retry).
        self.max_result_bytes = max_result_bytes
        self.schema = _sql.check_schema_name(
            schema or os.environ.get("FORKLIFT_SCHEMA", "forklift")
        )
        self.tasks: dict[str, Task[Any, Any]] = {}
        self.schedules: dict[str, Schedule] = {}
        self._producer = _producing.Producer(self)

    @property
    def dsn(self) -> str:
        return devdb.ready(_db.resolve_dsn(self._dsn), self.migrate, self.schema)

    # -- tasks -------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self, *, name: str | None = None, **options: Unpack[TaskOptions]
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        **options: Unpack[TaskOptions],
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a handler `fn(ctx, **kwargs)` as a task (bare or with options).

        `name`: the task's name (default: the function's). The options (queue, priority,
        max_attempts, max_crashes, timeout, backoff, limit, ...) are forklift.TaskOptions'.
        """

        def register(f: Callable[P, R]) -> Task[P, R]:
            # The function's name, the same wherever it is imported from (a script run
            # as __main__ and the worker that imports it agree).
            task_name = name if name is not None else f.__name__
            _check_new_task(self.tasks, task_name, options.get("queue", "default"), f)
            t: Task[P, R] = Task(self, f, name=task_name, **options)
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    @overload
    def periodic(
        self, *, task: Task[Any, Any] | str, **options: Unpack[declare.ScheduleOptions]
    ) -> Schedule: ...

    @overload
    def periodic(
        self, *, task: None = None, **options: Unpack[declare.PeriodicOptions]
    ) -> declare.Periodic: ...

    def periodic(
        self, *, task: Task[Any, Any] | str | None = None, **options: Any
    ) -> Schedule | declare.Periodic:
        """Schedule a task: `@app.periodic(cron=..., tz=..., name=...)` on a handler
        registers it as a task too; `app.periodic(task=t, cron=..., args=...)` schedules
        a task already registered. Options: `declare.ScheduleOptions`."""
        if task is not None:
            return declare.schedule(self, task, cast(declare.ScheduleOptions, options))
        return declare.Periodic(self, cast(declare.PeriodicOptions, options))

    def singleton(self, name: str) -> AbstractContextManager[_singleton.Singleton]:
        """`with app.singleton("name") as acquired:` one holder across every replica.

        A non-blocking advisory lock on a dedicated connection, always released. True
        while held: false, and `check()` raising SingletonLost, once its session ends.
        """
        _checked_name("singleton", name)
        return _singleton.singleton(
            _db.session_dsn(self.dsn), _db.Timeouts(), f"singleton:{self.schema}:{name}"
        )

    def get_task(self, name: str) -> Task[Any, Any]:
        if (found := self.tasks.get(name)) is None:
            raise UnknownTaskError(f"no task named {name!r} is registered")
        return found

    # -- producing ---------------------------------------------------------------------

    def _new_job(
        self,
        task_name: str,
        args: Mapping[str, Any] | None,
        **options: Unpack[JobOptions],
    ) -> NewJob:
        task = _task_for_enqueue(self.tasks, task_name)
        spec = JobSpec(task_name, {} if args is None else args, **options)
        return _job.build(spec, task, self.max_arg_bytes)

    def enqueue(
        self,
        task_name: str,
        args: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        timeout: float | None = None,
        **options: Unpack[JobOptions],
    ) -> int:
        """Enqueue `task_name` with `args`; return the job id. Options (JobOptions, the
        same for every way to enqueue): idempotency_key, run_at, delay, priority, queue,
        max_attempts, max_crashes.

        With an idempotency key that a job already has, no job is added and that job's
        id is returned. With `conn`, the insert joins the caller's transaction.
        `timeout`: seconds to wait for the database at most (default the App's
        enqueue_timeout, 5 s), for a connection or an answer; past it DatabaseError
        (transient). The insert, one statement, may still commit if it reached the
        database: enqueue again with an idempotency key and no job is added twice.
        With `conn`, your connection keeps its own bounds.
        """
        job = self._new_job(task_name, args, **options)  # refused before any connection
        return _producing.insert(self._producer, [job], conn, many=False, timeout=timeout)[0]

    async def enqueue_async(
        self,
        task_name: str,
        args: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        timeout: float | None = None,
        **options: Unpack[JobOptions],
    ) -> int:
        """enqueue() for asyncio code (FastAPI and the like): the same options, timeout,
        checks and SQL. With `conn`, a psycopg AsyncConnection, the insert joins its
        transaction; without, it runs on the producer's pool in a thread, never blocking
        the loop."""
        job = self._new_job(task_name, args, **options)
        ids = await _producing.insert_async(
            self._producer, [job], conn, many=False, timeout=timeout
        )
        return ids[0]

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, Mapping[str, Any]]],
        *,
        conn: psycopg.Connection[Any] | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """Enqueue many jobs in one transaction (COPY where possible); ids in input order.

        All or nothing: any error inserts none of them. `timeout`: as enqueue()'s, for
        each statement; one that times out has added none of the jobs unless its commit
        was under way. The rows go in by statements of at most 5,000, so no statement
        runs into the statement timeout however many jobs there are (500,000 keyed jobs
        take about 20 s). Jobs are validated as the COPY takes them; with `conn`, all
        before anything is sent, so a refused one leaves your transaction as it was.
        """
        specs = jobs if isinstance(jobs, Sequence) else list(jobs)
        if not specs:
            return []
        new = _built(self.tasks, specs, self.max_arg_bytes)
        return _producing.insert_many(self._producer, new, len(specs), conn, timeout)

    async def enqueue_many_async(
        self,
        jobs: Iterable[JobSpec | tuple[str, Mapping[str, Any]]],
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        timeout: float | None = None,
    ) -> list[int]:
        """enqueue_many() for asyncio code: in `conn`'s transaction (a psycopg
        AsyncConnection), or on the producer's pool in a thread; the same timeout."""
        new = self._new_jobs(jobs)
        if not new:
            return []
        return await _producing.insert_async(self._producer, new, conn, many=True, timeout=timeout)

    def _new_jobs(self, jobs: Iterable[JobSpec | tuple[str, Mapping[str, Any]]]) -> list[NewJob]:
        return list(_built(self.tasks, jobs, self.max_arg_bytes))

    # -- batches and results -------------------------------------------------------------

    def enqueue_batch(
        self,
        jobs: Iterable[JobSpec | tuple[str, Mapping[str, Any]]],
        *,
        on_complete: Task[Any, Any] | str | None = None,
        on_complete_args: Mapping[str, Any] | None = None,
        conn: psycopg.Connection[Any] | None = None,
        timeout: float | None = None,
    ) -> Batch:
        """Enqueue `jobs` (what enqueue_many takes; no idempotency keys) as one sealed
        batch, in one transaction (yours with `conn`). Once every job in it has succeeded,
        gone dead or been cancelled, `on_complete` (a task or a task name) is enqueued
        with `on_complete_args`, exactly once; its handler sees the batch as `ctx.batch`.
        `timeout`: as enqueue_many()'s."""
        wait = self._producer.wait(timeout)
        return batch.enqueue_batch(self, jobs, on_complete, on_complete_args, conn, wait)

    def batch(
        self,
        *,
        on_complete: Task[Any, Any] | str | None = None,
        on_complete_args: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> batch.BatchWriter:
        """`with app.batch(on_complete=...) as b: b.enqueue(task, **args)`: a batch whose
        jobs are added (and committed) in chunks, sealed when the block ends; see
        BatchWriter for what a block that raises does. `timeout`: as enqueue_many()'s,
        for each call of the block (its begin, each enqueue, its end)."""
        callback = batch.callback_spec(self, on_complete, on_complete_args)
        return batch.BatchWriter(self, callback, self._producer.wait(timeout))

    def get_batch(self, batch_id: int) -> Batch:
        """The batch `batch_id` (BatchNotFound if there is none)."""
        return batch.existing(Batch(batch_id, self.batches, self.ends))

    def result(self, job_id: int, timeout: float = 30.0) -> Any:
        """The result of job `job_id` once it succeeded (None: its handler returned
        none), waiting up to `timeout` seconds (0: not at all) while it is ready or
        running, woken by its end. Raises JobFailed (dead; `.error`: its last error),
        JobCancelled, JobNotFound (never enqueued, or pruned) or TimeoutError."""
        return batch.result(self, job_id, timeout)

    # -- workflows ---------------------------------------------------------------------

    def workflow(self, name: str = "", *, context: Mapping[str, Any] | None = None) -> Workflow:
        """A graph of jobs inserted at once (forklift.workflow): `a = wf.add(task, args)`,
        `wf.add(task, args, after=[a])`, `wf.enqueue()`; steps read ctx.workflow.context."""
        return Workflow(self, self._new_job, name, context)

    def chain(self, *links: Link) -> Workflow:
        """A workflow of `links` (tasks, or (task, args) pairs) run one after another."""
        return workflow.chain(self, self._new_job, links)

    # -- database ----------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        """The producer's job store, on a small pool opened lazily in this process."""
        return self._producer.store()

    @property
    def batches(self) -> BatchStore:
        """The producer's batch store, on the producer's pool."""
        return BatchStore(self.store.pool.connection, self.schema)

    def ends(self) -> _waiting.Ends:
        """What waiters (result(), Batch.wait()) hear ends by: the process's one LISTEN
        connection to this database, never one of the producer's pool."""
        return _waiting.ends(self.dsn)

    def migrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied."""
        return _migrate(self.dsn, self.schema)

    def close(self) -> None:
        """Close this process's producer pool (if any)."""
        self._producer.close()
