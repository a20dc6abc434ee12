"""A producer's statements as steps, so one piece of logic runs on a sync or an async
connection.

The enqueue logic (limit keys, backpressure, reserved ids, COPY, keyed inserts, taken
keys) is written once, as a generator that yields what to send and is sent back the
rows: `run` drives it on a psycopg Connection, `run_async` on an AsyncConnection (a
FastAPI request's own transaction). Neither driver knows anything about jobs.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import threading
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import pq

from forklift.store._boundary import Conn

log = logging.getLogger(__name__)

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
    iterator of them is taken as the COPY goes, and what it raises aborts the COPY.

    `unless_taken`: in a savepoint; if a row meets a unique index's key (UniqueViolation),
    none of them stays and the rows sent back are [] (else [(True,)]): the caller inserts
    them another way, knowing nothing went in."""

    sql: str
    rows: Iterable[Sequence[Any]]
    unless_taken: bool = False


@dataclass(frozen=True, slots=True)
class Aside:
    """Execute one statement on the store's own connection, apart from the caller's
    transaction (what must count even if that one rolls back): soon, from the process's
    aside thread (see `Asides`), never on the caller's thread."""

    sql: str
    params: Mapping[str, Any] | None = None


Step = Query | Copy | Aside
Steps = Generator[Step, Rows, T]
OwnConnection = Callable[[], AbstractContextManager[Conn]]


def run(
    steps: Steps[T], conn: Conn, own: OwnConnection, each: Callable[[], None] | None = None
) -> T:
    """Drive `steps` on `conn` (asides on a connection from `own`); their result. `each`
    is called before each step (a deadline restarted: _deadlines.Bound.rearm)."""
    try:
        step = next(steps)
        while True:
            if each is not None:
                each()
            rows: Rows = []
            match step:
                case Query(sql, params):
                    cur = conn.execute(sql, params)
                    rows = cur.fetchall() if _returned_rows(cur) else []
                case Copy(sql, copied, False):
                    with conn.cursor().copy(sql) as copy:
                        for row in copied:
                            copy.write_row(row)
                case Copy(sql, copied, True):
                    try:
                        with conn.transaction(), conn.cursor().copy(sql) as copy:
                            for row in copied:
                                copy.write_row(row)
                        rows = [(True,)]
                    except psycopg.errors.UniqueViolation:
                        rows = []
                case Aside(sql, params):
                    asides().add(own, sql, params)
            step = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


async def run_async(steps: Steps[T], conn: psycopg.AsyncConnection[Any], own: OwnConnection) -> T:
    """Drive `steps` on the async `conn`."""
    try:
        step = next(steps)
        while True:
            rows: Rows = []
            match step:
                case Query(sql, params):
                    cur = await conn.execute(sql, params)
                    rows = await cur.fetchall() if _returned_rows(cur) else []
                case Copy(sql, copied, False):
                    async with conn.cursor().copy(sql) as copy:
                        for row in copied:
                            await copy.write_row(row)
                case Copy(sql, copied, True):
                    try:
                        async with conn.transaction(), conn.cursor().copy(sql) as copy:
                            for row in copied:
                                await copy.write_row(row)
                        rows = [(True,)]
                    except psycopg.errors.UniqueViolation:
                        rows = []
                case Aside(sql, params):
                    asides().add(own, sql, params)
            step = steps.send(rows)
    except StopIteration as done:
        result: T = done.value
        return result


class Asides:
    """Runs the asides of this process, in order, from a thread of its own.

    The thread that yields an aside may hold the last free connection of its pool (an
    enqueue holds one while its steps run): waiting there for a second one would deadlock
    a pool full of such threads (8 producers refused by a full queue on a pool of 4 all
    waited the pool's 10 s timeout, and most then failed). So the caller goes on at once
    (QueueFull is raised without waiting), and this thread takes a connection once one is
    free, running what is pending on it. A statement that fails is logged and lost: what
    asides do is count (refused enqueues); a count never holds a job back.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()  # guards every field below
        self._pending: list[tuple[OwnConnection, str, Mapping[str, Any] | None]] = []
        self._running = False
        self._thread: threading.Thread | None = None

    def add(self, own: OwnConnection, sql: str, params: Mapping[str, Any] | None) -> None:
        with self._changed:
            if len(self._pending) >= MAX_PENDING_ASIDES:
                log.warning("an aside statement was dropped: %d pending", len(self._pending))
                return
            self._pending.append((own, sql, params))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="forklift-aside", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout: float) -> bool:
        """Wait up to `timeout` s until nothing is pending or running; whether it is so."""
        with self._changed:
            return self._changed.wait_for(lambda: not (self._pending or self._running), timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: bool(self._pending))
                pending, self._pending, self._running = self._pending, [], True
            try:
                for own, group in itertools.groupby(pending, key=lambda p: p[0]):
                    _execute(own, [(sql, params) for _, sql, params in group])
            finally:
                with self._changed:
                    self._running = False
                    self._changed.notify_all()


def _execute(own: OwnConnection, statements: list[tuple[str, Mapping[str, Any] | None]]) -> None:
    try:
        with own() as conn:
            for sql, params in statements:
                conn.execute(sql, params)
    except Exception as exc:  # counts lost, never a job
        log.warning("%d aside statement(s) failed: %s", len(statements), exc)


MAX_PENDING_ASIDES = 10_000
FLUSH_TIMEOUT = 2.0  # seconds App.close and the exit wait for pending asides

_asides: Asides | None = None
_asides_lock = threading.Lock()


def asides() -> Asides:
    """This process's aside runner (made on first use, in the process that uses it)."""
    global _asides
    with _asides_lock:
        if _asides is None:
            _asides = Asides()
        return _asides


def flush_asides(timeout: float = FLUSH_TIMEOUT) -> None:
    """Wait up to `timeout` s for this process's pending asides to run."""
    if _asides is not None:
        _asides.flush(timeout)


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads, and a lock one of them held stays
    # held: it starts with no aside runner and nothing pending.
    global _asides, _asides_lock
    _asides, _asides_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)
atexit.register(flush_asides)


def _returned_rows(cur: psycopg.Cursor[Any] | psycopg.AsyncCursor[Any]) -> bool:
    """Whether the statement just run returned rows (a result set, perhaps empty). Asked
    of the result's status: `cur.description` builds a Column, type lookup and all, for
    each of them: a sixth of a one-by-one enqueue's CPU."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK
