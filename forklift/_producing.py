"""Inserting validated jobs for App's producer calls, sync or async, traced when tracing
is on (_tracing.py): what enqueue, enqueue_many and their async twins share after
validation."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import psycopg

from forklift import _tracing
from forklift.store import JobStore, NewJob

# Seconds a producer's call (enqueue, enqueue_many and their async twins) waits for the
# database by default, on the producer's own connections: for a connection while the
# database is down, and for what it sent to be acknowledged while the network is gone.
# Past it the call raises DatabaseError and has inserted nothing. A request handler that
# enqueues is held that long at most by an outage, not through it.
ENQUEUE_TIMEOUT = 5.0


def insert(
    store: JobStore,
    jobs: Sequence[NewJob],
    conn: psycopg.Connection[Any] | None,
    *,
    many: bool,
    wait: float | None = None,
) -> list[int]:
    """Insert `jobs` (JobStore.job_insert_many if `many`, else job_insert of the one) on
    the producer's pool, waiting `wait` seconds at most for the database, or in `conn`'s
    transaction; their ids."""
    with _tracing.enqueuing(jobs) as span:
        if many:
            return store.job_insert_many(jobs, conn, wait=wait)
        job_id = store.job_insert(jobs[0], conn, wait=wait)
        _tracing.enqueued(span, job_id)
        return [job_id]


def insert_many(
    store: JobStore,
    jobs: Iterator[NewJob],
    count: int,
    conn: psycopg.Connection[Any] | None,
    wait: float | None = None,
) -> list[int]:
    """insert() of the `count` `jobs`, an iterator that validates each as it is taken. On
    the producer's pool they are inserted as they come (JobStore.job_insert_many); taken
    first in `conn`'s transaction (a refusal in the middle of a COPY would abort it) and
    when tracing (the enqueue span's context goes into every job before the insert)."""
    if conn is not None or _tracing.tracer() is not None:
        return insert(store, list(jobs), conn, many=True, wait=wait)
    return store.job_insert_many(jobs, count=count, wait=wait)


async def insert_async(
    store: Callable[[], JobStore],
    jobs: Sequence[NewJob],
    conn: psycopg.AsyncConnection[Any] | None,
    *,
    many: bool,
    wait: float | None = None,
) -> list[int]:
    """insert() for asyncio code: in `conn`'s transaction (an AsyncConnection), or, with
    none, on the producer's pool in a thread (asyncio.to_thread), never blocking the
    loop. `store` gives the producer's store (its pool connects: called in a thread)."""
    if conn is None:
        return await asyncio.to_thread(lambda: insert(store(), jobs, None, many=many, wait=wait))
    found = await asyncio.to_thread(store)
    with _tracing.enqueuing(jobs) as span:
        if many:
            return await found.job_insert_many_async(jobs, conn)
        job_id = await found.job_insert_async(jobs[0], conn)
        _tracing.enqueued(span, job_id)
        return [job_id]
