"""A producer's waits for the database, bounded on the client's side.

The server's bounds (statement, lock timeouts) need a server that answers, and TCP's need
a peer that stops acknowledging: neither ends a call whose database went away behind a
network that still accepts the bytes (a stalled proxy, a load balancer, a host frozen
with its kernel up). So a producer's call names a deadline, and one thread per process
keeps them: a call past its deadline has its connection's socket shut down (not closed:
its descriptor stays the connection's), the statement under way fails at once as a lost
connection, and the call raises DatabaseError saying it timed out. The pool drops the
broken connection. A deadline costs its call a dictionary entry under a lock; the thread
looks ten times a second while calls come and sleeps once they stop.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg

from forklift.errors import DatabaseError

TICK = 0.1  # seconds between the keeper's looks while calls come
PARK_AFTER = 1.0  # seconds without a call after which the keeper sleeps until the next


class Bound:
    """One call's deadline on one connection; `rearm()` starts its count again (each
    statement of a long batch gets the whole time)."""

    __slots__ = ("fd", "fired", "keeper", "seconds")

    def __init__(self, keeper: Keeper, fd: int, seconds: float) -> None:
        self.keeper = keeper
        self.fd = fd
        self.seconds = seconds
        self.fired = False  # the keeper shut the connection down

    def rearm(self) -> None:
        self.keeper.arm(self, time.monotonic() + self.seconds)


class Keeper:
    """The deadlines of this process's calls, and the thread that keeps them: it looks
    every TICK while calls come, and parks after PARK_AFTER without one (an arm then
    wakes it); a steady stream of calls never wakes it call by call."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())  # guards every field below
        self._armed: dict[Bound, float] = {}  # bound -> its deadline (monotonic)
        self._thread: threading.Thread | None = None
        self._parked = False

    def arm(self, bound: Bound, deadline: float) -> None:
        with self._changed:
            if bound.fired:
                return
            self._armed[bound] = deadline
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep, name="forklift-deadlines", daemon=True
                )
                self._thread.start()
            elif self._parked:
                self._changed.notify()

    def disarm(self, bound: Bound) -> None:
        """From here on the keeper leaves `bound`'s connection alone (it may close)."""
        with self._changed:
            self._armed.pop(bound, None)

    def _keep(self) -> None:
        last_armed = time.monotonic()
        while True:
            with self._changed:
                now = time.monotonic()
                if self._armed:
                    last_armed = now
                elif now - last_armed > PARK_AFTER:
                    self._parked = True
                    while not self._armed:
                        self._changed.wait()
                    self._parked = False
                    now = last_armed = time.monotonic()
                for bound, deadline in list(self._armed.items()):
                    if deadline <= now:
                        # Under the lock: a disarmed connection, whose descriptor may be
                        # closed and reused, is never touched.
                        del self._armed[bound]
                        bound.fired = True
                        _shut_down(bound.fd)
            time.sleep(TICK)


def _shut_down(fd: int) -> None:
    try:
        with socket.socket(fileno=os.dup(fd)) as sock:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # gone already


_keeper: Keeper | None = None
_keeper_lock = threading.Lock()


def keeper() -> Keeper:
    """This process's keeper (made on first use, in the process that uses it)."""
    global _keeper
    found = _keeper  # the common case, without the lock
    if found is not None:
        return found
    with _keeper_lock:
        if _keeper is None:
            _keeper = Keeper()
        return _keeper


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads, and a lock one of them held stays
    # held: it starts with no keeper.
    global _keeper, _keeper_lock
    _keeper, _keeper_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


# What the error of a call that timed out tells its caller to do, by default.
AGAIN = "enqueue again with an idempotency key and no job is added twice"


@contextmanager
def bounded(
    conn: psycopg.Connection[Any], seconds: float, what: str, again: str = AGAIN
) -> Iterator[Bound]:
    """Within the block, `conn` waits for the database at most `seconds` at a time (from
    the block's start, or the last `rearm()`); past it the connection is shut down and
    the block's error becomes a DatabaseError saying `what` timed out, and `again`: how
    to try again without doing it twice."""
    bound = Bound(keeper(), conn.fileno(), seconds)
    bound.rearm()
    try:
        yield bound
    except BaseException as exc:
        bound.keeper.disarm(bound)
        # Fired, a statement's error is the shutdown's, already translated or not.
        if bound.fired and isinstance(exc, psycopg.Error | OSError | DatabaseError):
            raise DatabaseError(
                f"{what}: no answer from the database within {seconds:g} s (the call's "
                "timeout); what was sent may still commit if it reaches the database (a "
                f"transaction whose commit was not sent does not): {again}",
                cause=exc,
            ) from exc
        raise
    bound.keeper.disarm(bound)


@contextmanager
def connection(
    connect: Callable[[float | None], AbstractContextManager[psycopg.Connection[Any]]],
    wait: float | None,
    what: str,
    again: str = AGAIN,
) -> Iterator[tuple[psycopg.Connection[Any], Callable[[], None] | None]]:
    """A connection from `connect` (a pool's) for a producer's call that waits at most
    `wait` seconds at a time for the database (None: the pool's and the session's own
    bounds): for the connection while it is down, and for each answer while it is
    unreachable (bounded); with what restarts the count (before each statement of a long
    batch)."""
    if wait is None:
        with connect(None) as own:
            yield own, None
        return
    with connect(wait) as own, bounded(own, wait, what, again) as bound:
        yield own, bound.rearm


def connector(
    connect: Callable[[float | None], AbstractContextManager[psycopg.Connection[Any]]],
    wait: float | None,
    what: str,
    again: str = AGAIN,
) -> Callable[[], AbstractContextManager[psycopg.Connection[Any]]]:
    """`connection()` as a store that takes its connections one call at a time wants it
    (BatchStore): each connection bounded by `wait`, with no restart of the count."""

    @contextmanager
    def bounded_connection() -> Iterator[psycopg.Connection[Any]]:
        with connection(connect, wait, what, again) as (own, _):
            yield own

    return bounded_connection
