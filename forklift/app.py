"""App: configuration, the task registry and the producer API."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar, overload

import psycopg
from psycopg_pool import ConnectionPool

from forklift import _db, _json, _sql
from forklift.backoff import Backoff
from forklift.errors import ArgumentError, ConfigError, UnknownTaskError
from forklift.store import JobStore, NewJob, short_connection, translated
from forklift.task import Task, check_priority

P = ParamSpec("P")
R = TypeVar("R")


def _seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if seconds < 0:
        raise ArgumentError(f"delay must be >= 0 seconds, got {seconds}")
    return seconds


@dataclass(frozen=True)
class JobSpec:
    """One job for App.enqueue_many()."""

    task: str
    args: Mapping[str, Any]
    idempotency_key: str | None = None
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    priority: int | None = None
    queue: str | None = None
    max_attempts: int | None = None


class App:
    """A forklift application: where the database is, and which tasks exist.

    Creating an App opens nothing: connections are made on first use, in the process
    that uses them, so an App can be imported before a fork.
    """

    def __init__(self, dsn: str | None = None, *, schema: str | None = None) -> None:
        self._dsn = dsn
        self.schema = _sql.check_schema_name(
            schema or os.environ.get("FORKLIFT_SCHEMA", "forklift")
        )
        self.tasks: dict[str, Task[Any, Any]] = {}
        self._lock = threading.Lock()
        self._pool: ConnectionPool[psycopg.Connection[Any]] | None = None
        self._pool_pid = 0
        self._store: JobStore | None = None

    @property
    def dsn(self) -> str:
        return _db.resolve_dsn(self._dsn)

    # -- tasks -------------------------------------------------------------------------

    @overload
    def task(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    @overload
    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        backoff: Backoff | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...

    def task(  # type: ignore[misc]
        self,
        fn: Callable[P, R] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        backoff: Backoff | None = None,
    ) -> Task[P, R] | Callable[[Callable[P, R]], Task[P, R]]:
        """Register a handler `fn(ctx, **kwargs)` as a task (bare or with options)."""

        def register(f: Callable[P, R]) -> Task[P, R]:
            if name is None and f.__module__ == "__main__":
                # Workers import the module under its real name, never as __main__: a
                # derived name would differ between producer and worker.
                raise ConfigError(
                    f"task {f.__qualname__!r} is defined in a script run as __main__: "
                    "give it an explicit name, e.g. @app.task(name=...)"
                )
            task_name = name or f"{f.__module__}.{f.__qualname__}"
            if task_name in self.tasks:
                raise ConfigError(f"task {task_name!r} is registered twice")
            t: Task[P, R] = Task(
                self,
                f,
                name=task_name,
                queue=queue,
                priority=priority,
                max_attempts=max_attempts,
                timeout=timeout,
                backoff=backoff or Backoff(),
            )
            self.tasks[task_name] = t
            return t

        return register(fn) if fn is not None else register

    def get_task(self, name: str) -> Task[Any, Any]:
        try:
            return self.tasks[name]
        except KeyError:
            raise UnknownTaskError(f"no task named {name!r} is registered") from None

    # -- producing ---------------------------------------------------------------------

    def _new_job(
        self,
        task_name: str,
        args: Mapping[str, Any] | None,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
    ) -> NewJob:
        if not task_name or not isinstance(task_name, str):
            raise ArgumentError("task name must be a non-empty string")
        args = {} if args is None else args
        text = _json.dumps_args(args)
        task = self.tasks.get(task_name)
        if task is not None:
            task.check_args(args)
        if idempotency_key is not None and not isinstance(idempotency_key, str):
            raise ArgumentError("idempotency_key must be a string")
        if run_at is not None and run_at.tzinfo is None:
            raise ArgumentError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
        if priority is not None:
            check_priority(priority)
        if max_attempts is not None and max_attempts < 1:
            raise ArgumentError("max_attempts must be >= 1")
        if task is None:
            return NewJob(
                task_name,
                text,
                queue or "default",
                priority or 0,
                max_attempts or 5,
                None,
                idempotency_key,
                run_at,
                _seconds(delay),
            )
        return NewJob(
            task_name,
            text,
            queue or task.queue,
            task.priority if priority is None else priority,
            max_attempts or task.max_attempts,
            task.timeout,
            idempotency_key,
            run_at,
            _seconds(delay),
        )

    def enqueue(
        self,
        task_name: str,
        args: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        conn: psycopg.Connection[Any] | None = None,
    ) -> int:
        """Enqueue `task_name` with `args`; return the job id.

        With an idempotency key that a job already has, no job is added and that job's
        id is returned. With `conn`, the insert joins the caller's transaction.
        """
        job = self._new_job(
            task_name,
            args,
            idempotency_key=idempotency_key,
            run_at=run_at,
            delay=delay,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
        )
        return self.store.job_insert(job, conn)

    def enqueue_many(
        self,
        jobs: Iterable[JobSpec | tuple[str, Mapping[str, Any]]],
        *,
        conn: psycopg.Connection[Any] | None = None,
    ) -> list[int]:
        """Enqueue many jobs in one transaction (COPY where possible); ids in input order."""
        new = [
            self._new_job(*spec)
            if isinstance(spec, tuple)
            else self._new_job(
                spec.task,
                spec.args,
                idempotency_key=spec.idempotency_key,
                run_at=spec.run_at,
                delay=spec.delay,
                priority=spec.priority,
                queue=spec.queue,
                max_attempts=spec.max_attempts,
            )
            for spec in jobs
        ]
        if not new:
            return []
        return self.store.job_insert_many(new, conn)

    # -- database ----------------------------------------------------------------------

    @property
    def store(self) -> JobStore:
        """The producer's job store, on a small pool opened lazily in this process."""
        with self._lock:
            if self._store is None or self._pool_pid != os.getpid():
                # A pool inherited across fork is never touched: its sockets are the parent's.
                self._pool = _db.make_pool(self.dsn, _db.Timeouts(), max_size=4, name="producer")
                with translated("cannot connect"):
                    self._pool.open(wait=True, timeout=_db.Timeouts().connect * 2)
                self._pool_pid = os.getpid()
                self._store = JobStore(self._pool, self.schema)
            return self._store

    def migrate(self) -> list[int]:
        """Apply pending schema migrations; return the versions applied."""
        from forklift.schema import migrate

        timeouts = _db.Timeouts(statement=60.0, lock=30.0)
        with short_connection(self.dsn, timeouts, "forklift-migrate", "migrate") as conn:
            return migrate(conn, self.schema)

    def close(self) -> None:
        """Close this process's producer pool (if any)."""
        with self._lock:
            if self._pool is not None and self._pool_pid == os.getpid():
                self._pool.close()
            self._pool = None
            self._store = None
