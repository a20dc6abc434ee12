"""Waiting for a job or a batch to end, without holding a producer's connection.

Every waiter of a process (app.result(), Batch.wait(); any thread, any App of the same
database) shares one listener: a session connection of its own, never one of a pool,
that LISTENs on the waiters' channels, and a thread (`forklift-waits`) that hands each
notification to the waiters of its hint ('j<id>', 'b<id>'). A waiter reads the row it
waits for by a short call on a pooled connection, returned at once: first, after it
registered, on every hint, and every POLL_HEARD seconds (a hint may be lost while the
listener reconnects, or be forged: it is never taken for the answer); every POLL
seconds while no LISTEN is in force (connecting, or behind a transaction pooler with no
session URL, where a notification may never arrive).

The listener is made on first use in the process that uses it (nothing crosses a fork)
and closes after IDLE seconds without a waiter.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from forklift import _db, _sql
from forklift._service import Repeats
from forklift.errors import DatabaseError
from forklift.store import Conn, short_connection

log = logging.getLogger(__name__)

T = TypeVar("T")

POLL = 0.5  # seconds between reads while no LISTEN is in force for the waiter
POLL_HEARD = 5.0  # seconds between reads while one is: a fallback only
TICK = 0.5  # seconds the listener's thread waits for notifications between looks
IDLE = 30.0  # seconds without a waiter after which the listener closes
RECONNECT = (0.2, 5.0)  # seconds between the listener's connects: first, at most


class Waiter:
    """One wait: `woken` is set by a hint for it (or a new LISTEN that may have missed
    one); the waiter clears it before each read."""

    __slots__ = ("hint", "schema", "woken")

    def __init__(self, schema: str, hint: str) -> None:
        self.schema = schema
        self.hint = hint
        self.woken = threading.Event()


class Ends:
    """The process's LISTEN on the ends of jobs and batches in one database (a
    connection to its session URL), and the thread that reads it. `deaf` when
    notifications cannot be trusted to arrive: a transaction pooler (found by the first
    connect, or known before) and no session URL beside it (`session`: one was given);
    then no connection is kept, and waits read on a timer."""

    def __init__(self, dsn: str, *, deaf: bool = False, session: bool = True) -> None:
        self.dsn = dsn
        self.deaf = deaf
        self.session = session
        self._lock = threading.Lock()  # guards every field below
        self._waiters: dict[tuple[str, str], set[Waiter]] = {}  # (channel, hint)
        self._schemas: dict[str, int] = {}  # schema: waiters on its channel
        self._listening: set[str] = set()  # schemas whose LISTEN is in force
        self._thread: threading.Thread | None = None
        self._idle_since = time.monotonic()
        self._errors = Repeats()

    @contextmanager
    def waiting(self, schema: str, hint: str) -> Iterator[Waiter]:
        """Registered for `hint` on `schema`'s channel while the block runs."""
        waiter = Waiter(schema, hint)
        key = (_sql.done_channel_name(schema), hint)
        with self._lock:
            self._waiters.setdefault(key, set()).add(waiter)
            self._schemas[schema] = self._schemas.get(schema, 0) + 1
            if self._thread is None and not self.deaf:
                self._thread = threading.Thread(
                    target=self._run, name="forklift-waits", daemon=True
                )
                self._thread.start()
        try:
            yield waiter
        finally:
            with self._lock:
                waiters = self._waiters[key]
                waiters.discard(waiter)
                if not waiters:
                    del self._waiters[key]
                self._schemas[schema] -= 1
                if not self._schemas[schema]:
                    del self._schemas[schema]
                if not self._waiters:
                    self._idle_since = time.monotonic()

    def heard(self, schema: str) -> bool:
        """Whether a LISTEN on `schema`'s channel is in force (hints will arrive)."""
        with self._lock:
            return schema in self._listening

    def _run(self) -> None:
        pause = RECONNECT[0]
        while True:
            try:
                with short_connection(self.dsn, _db.Timeouts(), "forklift-wait", "waiting") as conn:
                    if not self.session and _db.pooled(self.dsn):
                        self._go_deaf()  # a LISTEN here would land on a lent connection
                        return
                    pause = RECONNECT[0]
                    self._serve(conn)
                    return  # no waiter for IDLE seconds: the connection closes
            except Exception as exc:  # a lost connection, or worse: waiters poll meanwhile
                with self._lock:
                    self._listening.clear()
                if isinstance(exc, DatabaseError) and not _db.transient(exc):
                    # Refused: every LISTEN would be refused again. Waits read on a timer.
                    log.error("waiters' listener: %s; waits read every %g s instead", exc, POLL)
                    self._go_deaf()
                    return
                if self._errors.worth_logging(exc):
                    log.warning("waiters' listener: %s; waits read every %g s meanwhile", exc, POLL)
            time.sleep(pause)
            pause = min(pause * 2, RECONNECT[1])
            if self._done():
                return

    def _done(self) -> bool:
        """Whether the thread ends now (no waiter for IDLE seconds): if so, it is gone
        from here on (the next waiter starts another)."""
        with self._lock:
            if self._waiters or time.monotonic() - self._idle_since < IDLE:
                return False
            self._thread = None
            self._listening.clear()
            return True

    def _go_deaf(self) -> None:
        with self._lock:
            self.deaf = True
            self._thread = None
            self._listening.clear()

    def _serve(self, conn: Conn) -> None:
        """LISTEN on every channel waited on, hand each notification to its waiters."""
        while not self._done():
            with self._lock:
                wanted = set(self._schemas) - self._listening
            for schema in sorted(wanted):
                conn.execute(_sql.load("forklift.store", "batches.sql", schema)["done_listen"])
            if wanted:
                with self._lock:
                    self._listening |= wanted
                    channels = {_sql.done_channel_name(s) for s in wanted}
                    for (channel, _), waiters in self._waiters.items():
                        if channel in channels:  # an end before the LISTEN: read again
                            for waiter in waiters:
                                waiter.woken.set()
            for note in conn.notifies(timeout=TICK):
                with self._lock:
                    for waiter in self._waiters.get((note.channel, note.payload), ()):
                        waiter.woken.set()


_ends: dict[str, Ends] = {}
_ends_lock = threading.Lock()
_left_behind: list[Ends] = []  # a parent's, in a forked child: never touched


def ends(dsn: str) -> Ends:
    """This process's listener for the ends in the database of `dsn` (made on first use)."""
    session = _db.session_dsn(dsn)
    with _ends_lock:
        found = _ends.get(session)
        if found is None:
            # Through a transaction pooler, with no session URL beside it, a LISTEN lands
            # on whichever server connection the pooler lends: waits read on a timer.
            given = session != dsn
            found = _ends[session] = Ends(
                session, deaf=not given and _db.pooled(dsn), session=given
            )
        return found


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads, and its copies of the parent's
    # connections are the parent's sockets: it starts with no listener and no lock held.
    global _ends_lock
    _left_behind.extend(_ends.values())
    _ends.clear()
    _ends_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def wait_for_end(
    hints: Ends,
    schema: str,
    hint: str,
    check: Callable[[], T | None],
    timeout: float,
    mark: Callable[[], None] | None = None,
) -> T | None:
    """`check()` until it gives an answer or `timeout` seconds pass (None then).

    `check` and `mark` each take a pooled connection for one statement and give it back.
    With time to wait, the waiter registers for `hint`, `mark`s the row waited for (so
    its end notifies) and checks again before each wait: an end committed between the
    first check and the LISTEN is read, never missed (a LISTEN coming into force wakes
    every waiter on its channel to read again). The first check's DatabaseError is
    raised at once, and so is any refusal (`_db.transient` says no: reading again gets
    the same answer); a later one of the database unavailable for a moment is read again
    every POLL seconds, and raised only if it is still failing at the deadline.
    """
    deadline = time.monotonic() + timeout
    found = check()
    if found is not None or timeout <= 0:
        return found
    marked = mark is None
    with hints.waiting(schema, hint) as waiter:
        while True:
            waiter.woken.clear()
            failed: DatabaseError | None = None
            try:
                if not marked:
                    assert mark is not None
                    mark()
                    marked = True
                found = check()
            except DatabaseError as exc:
                if not _db.transient(exc):
                    raise
                failed = exc
            if found is not None:
                return found
            left = deadline - time.monotonic()
            if left <= 0:
                if failed is not None:
                    raise failed
                return None
            heard = failed is None and hints.heard(schema)
            waiter.woken.wait(min(POLL_HEARD if heard else POLL, left))
