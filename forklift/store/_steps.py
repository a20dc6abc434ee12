"""A producer's statements as steps, so one piece of logic runs on a sync or an async
connection.

The enqueue logic (limit keys, backpressure, reserved ids, COPY, keyed inserts, taken
keys) is written once, as a generator that yields what to send and is sent back the
rows: `run` drives it on a psycopg Connection, `run_async` on an AsyncConnection (a
FastAPI request's own transaction). Neither driver knows anything about jobs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from forklift.store._boundary import Conn

T = TypeVar("T")
Rows = list[tuple[Any, ...]]


@dataclass(frozen=True, slots=True)
class Query:
    """Execute one statement on the caller's connection; its rows come back ([]: none)."""

    sql: str
    params: Mapping[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class Copy:
    """COPY `rows` in through `sql` (COPY ... FROM STDIN) on the caller's connection; an
    iterator of them is taken as the COPY goes, and what it raises aborts the COPY."""

    sql: str
    rows: Iterable[Sequence[Any]]


@dataclass(frozen=True, slots=True)
class Aside:
    """Execute one statement on the store's own connection, apart from the caller's
    transaction (what must count even if that one rolls back)."""

    sql: str
    params: Mapping[str, Any] | None = None


Step = Query | Copy | Aside
Steps = Generator[Step, Rows, T]
OwnConnection = Callable[[], AbstractContextManager[Conn]]


def run(steps: Steps[T], conn: Conn, own: OwnConnection) -> T:
    """Drive `steps` on `conn` (asides on a connection from `own`); their result."""
    try:
        step = next(steps)
        while True:
            rows: Rows = []
            match step:
                case Query(sql, params):
                    cur = conn.execute(sql, params)
                    rows = cur.fetchall() if _returned_rows(cur) else []
                case Copy(sql, copied):
                    with conn.cursor().copy(sql) as copy:
                        for row in copied:
                            copy.write_row(row)
                case Aside(sql, params):
                    _aside(own, sql, params)
            step = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(steps: Steps[T], conn: psycopg.AsyncConnection[Any], own: OwnConnection) -> T:
    """Drive `steps` on the async `conn`; an aside goes to a thread (the store's own
    connections are sync ones)."""
    try:
        step = next(steps)
        while True:
            rows: Rows = []
            match step:
                case Query(sql, params):
                    cur = await conn.execute(sql, params)
                    rows = await cur.fetchall() if _returned_rows(cur) else []
                case Copy(sql, copied):
                    async with conn.cursor().copy(sql) as copy:
                        for row in copied:
                            await copy.write_row(row)
                case Aside(sql, params):
                    await asyncio.to_thread(_aside, own, sql, params)
            step = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


def _aside(own: OwnConnection, sql: str, params: Mapping[str, Any] | None) -> None:
    with own() as conn:
        conn.execute(sql, params)


def _returned_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement just run returned rows (a result set, perhaps empty). Asked
    of the result's status: `cur.description` builds a Column, type lookup and all, for
    each of them: a sixth of a one-by-one enqueue's CPU."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK
