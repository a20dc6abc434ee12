"""Inserting validated jobs for App's producer calls, sync or async, traced when tracing
is on (_tracing.py): what enqueue, enqueue_many and their async twins share after
validation."""

from __future__ import annotations

import asyncio
import math
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import psycopg

from forklift import _db, _tracing
from forklift.errors import ConfigError
from forklift.store import JobStore, NewJob, _steps
from forklift.store._boundary import translated

# Seconds a producer's call (enqueue, enqueue_many and their async twins) waits for the
# database by default, on the producer's own connections: for a connection while the
# database is down, and for what it sent to be acknowledged while the network is gone.
# Past it the call raises DatabaseError (what it sent may still commit if it reached the
# database: _deadlines.bounded). A request handler that enqueues is held that long at
# most by an outage, not through it.
ENQUEUE_TIMEOUT = 5.0


def seconds(value: float) -> float:
    """`value` as an enqueue timeout: a finite number of seconds > 0, or ConfigError."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
        raise ConfigError(f"an enqueue timeout is a number of seconds > 0, got {value!r}")
    return float(value)


class Settings(Protocol):
    """What the producer reads of its App, as they are when it needs them (a test may set
    an App's schema after making it)."""

    @property
    def dsn(self) -> str: ...

    schema: str
    enqueue_timeout: float


class Producer:
    """An App's producer connections: a small pool, opened lazily in the process that
    uses it (a pool inherited across fork is never touched: its sockets are the
    parent's), and the job store on it."""

    def __init__(self, app: Settings) -> None:
        self._app = app
        self._lock = threading.Lock()
        self._pool: _db.LivePool | None = None
        self._pid = 0
        self._store: JobStore | None = None

    def wait(self, timeout: float | None) -> float:
        """A call's `timeout`, or the App's default when it names none."""
        return self._app.enqueue_timeout if timeout is None else seconds(timeout)

    def store(self, wait: float | None = None) -> JobStore:
        """The store; the first call in a process opens its pool, within `wait` seconds
        if given (a call's timeout: libpq waits 2 s at least for a connection), else
        within the connect timeout."""
        store = self._store
        if store is not None and self._pid == os.getpid():
            return store  # the common case, without the lock every enqueue contended for
        with self._lock:
            if self._store is None or self._pid != os.getpid():
                dsn, schema = self._app.dsn, self._app.schema
                opening = _db.Timeouts() if wait is None else _db.Timeouts(connect=wait)
                _db.probe(dsn, opening)  # a clear cause now, not a pool timeout
                pool = _db.make_pool(dsn, _db.Timeouts(), max_size=4, name="producer")
                filled = opening.connect * 2 if wait is None else max(2.0, wait)
                try:
                    with translated("cannot connect"):
                        pool.open(wait=True, timeout=filled)
                except BaseException:
                    pool.close()
                    raise
                self._pool, self._pid = pool, os.getpid()
                self._store = JobStore(pool, schema)
            return self._store

    def close(self) -> None:
        """Close this process's pool (if any): the last enqueues' wake-ups sent first."""
        with self._lock:
            if self._pool is not None and self._pid == os.getpid():
                if self._store is not None:
                    self._store.notifier.close()  # the last enqueues' wake-up first
                    _steps.flush_asides()  # and their refusals' counts
                self._pool.close()
            self._pool = None
            self._store = None


def insert(
    producer: Producer,
    jobs: Sequence[NewJob],
    conn: psycopg.Connection[Any] | None,
    *,
    many: bool,
    timeout: float | None = None,
) -> list[int]:
    """Insert `jobs` (JobStore.job_insert_many if `many`, else job_insert of the one) on
    the producer's pool, waiting `timeout` seconds at most for the database (its pool's
    opening included), or in `conn`'s transaction; their ids."""
    wait = producer.wait(timeout)
    store = producer.store(wait)
    with _tracing.enqueuing(jobs) as span:
        if many:
            return store.job_insert_many(jobs, conn, wait=wait)
        job_id = store.job_insert(jobs[0], conn, wait=wait)
        _tracing.enqueued(span, job_id)
        return [job_id]


def insert_many(
    producer: Producer,
    jobs: Iterator[NewJob],
    count: int,
    conn: psycopg.Connection[Any] | None,
    timeout: float | None = None,
) -> list[int]:
    """insert() of the `count` `jobs`, an iterator that validates each as it is taken. On
    the producer's pool they are inserted as they come (JobStore.job_insert_many); taken
    first in `conn`'s transaction (a refusal in the middle of a COPY would abort it) and
    when tracing (the enqueue span's context goes into every job before the insert)."""
    if conn is not None or _tracing.tracer() is not None:
        return insert(producer, list(jobs), conn, many=True, timeout=timeout)
    wait = producer.wait(timeout)
    return producer.store(wait).job_insert_many(jobs, count=count, wait=wait)


async def insert_async(
    producer: Producer,
    jobs: Sequence[NewJob],
    conn: psycopg.AsyncConnection[Any] | None,
    *,
    many: bool,
    timeout: float | None = None,
) -> list[int]:
    """insert() for asyncio code: in `conn`'s transaction (an AsyncConnection), or, with
    none, on the producer's pool in a thread (asyncio.to_thread), never blocking the
    loop (the pool connects in a thread too)."""
    wait = producer.wait(timeout)
    if conn is None:
        return await asyncio.to_thread(insert, producer, jobs, None, many=many, timeout=wait)
    found = await asyncio.to_thread(producer.store, wait)
    with _tracing.enqueuing(jobs) as span:
        if many:
            return await found.job_insert_many_async(jobs, conn)
        job_id = await found.job_insert_async(jobs[0], conn)
        _tracing.enqueued(span, job_id)
        return [job_id]
