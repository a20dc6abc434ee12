"""A small connection pool that never hands out a connection it can tell is dead.

psycopg_pool reconnects in the background on its own exponential backoff (1, 2, 4, 8,
16 s, ...): after a 20 s outage the first claim waited ~8 s for that schedule, though the
database had been back for most of it; and it handed out, one checkout at a time,
connections whose backends a failover or a pg_terminate_backend storm had ended, each
failing one claim. This pool has no background thread and no schedule of its own:

- With no good idle connection and room to grow, the caller connects, in its own thread,
  bounded by connect_timeout: a connection comes the moment the database takes one, and
  when it does not, the caller gets the real cause, not a pool timeout.
- An idle connection is checked before it is handed out, without a round trip: a healthy
  idle connection has nothing to read, one whose backend ended has its FATAL message or
  its EOF waiting on the socket (a poll of the socket, a microsecond).
- A connection that comes back broken takes every idle one with it: what ended one
  session (a restart, a failover) has usually ended them all.

Fresh connections go straight to the caller, unchecked; only returned ones are checked.
Nothing here is created before a fork that is used after it (open() it in the process
that uses it).
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
from psycopg.pq import TransactionStatus

Conn = psycopg.Connection[Any]


class PoolTimeout(psycopg.OperationalError):
    """No connection came free in time: every one of the pool's connections is in use."""


class PoolClosed(psycopg.OperationalError):
    """The pool is closed."""


def looks_alive(conn: Conn) -> bool:
    """False if the connection is known dead, or its socket has something to say while
    idle (a terminated backend's FATAL error, or EOF)."""
    if conn.closed or conn.broken:
        return False
    try:
        poller = select.poll()
        poller.register(conn.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except (OSError, ValueError, psycopg.Error):
        return False


class Pool:
    """Up to `max_size` autocommit connections to one database, made on demand."""

    def __init__(
        self,
        conninfo: str,
        *,
        max_size: int,
        kwargs: dict[str, Any],
        timeout: float,
        name: str,
    ) -> None:
        self.conninfo = conninfo
        self.max_size = max_size
        self.kwargs = kwargs
        self.timeout = timeout  # how long getconn waits for a connection to come free
        self.name = name
        self._cond = threading.Condition()
        self._idle: list[Conn] = []  # most recently returned last: reused first
        self._size = 0  # connections open or being opened, idle or out
        self._open = False

    def open(self, wait: bool = False, timeout: float | None = None) -> None:
        """Start handing out connections; with `wait`, connect one now (or raise why not)."""
        with self._cond:
            self._open = True
        if wait:
            self.putconn(self.getconn(timeout))

    def close(self, timeout: float | None = None) -> None:
        """Close the idle connections; those out are closed when they come back."""
        with self._cond:
            self._open = False
            idle, self._idle = self._idle, []
            self._size -= len(idle)
            self._cond.notify_all()
        for conn in idle:
            _close(conn)

    @property
    def closed(self) -> bool:
        return not self._open

    def stats(self) -> dict[str, int]:
        """{"size": connections open, "idle": of them, waiting in the pool}."""
        with self._cond:
            return {"size": self._size, "idle": len(self._idle)}

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Conn]:
        conn = self.getconn(timeout)
        try:
            yield conn
        finally:
            self.putconn(conn)

    def getconn(self, timeout: float | None = None) -> Conn:
        """A live connection: a checked idle one, else a new one, else wait for one."""
        wait = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + wait
        dead: list[Conn] = []
        try:
            with self._cond:
                while True:
                    if not self._open:
                        raise PoolClosed(f"the pool {self.name!r} is closed")
                    while self._idle:
                        conn = self._idle.pop()
                        if looks_alive(conn):
                            return conn
                        dead.append(conn)
                        self._size -= 1
                    if self._size < self.max_size:
                        self._size += 1
                        break
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise PoolTimeout(
                            f"all {self.max_size} connections of {self.name!r} in use for "
                            f"{wait:.2f} s"
                        )
                    self._cond.wait(left)
        finally:
            for conn in dead:
                _close(conn)
        return self._connect()

    def _connect(self) -> Conn:
        try:
            return psycopg.connect(self.conninfo, autocommit=True, **self.kwargs)
        except BaseException:
            with self._cond:
                self._size -= 1
                self._cond.notify()
            raise

    def putconn(self, conn: Conn) -> None:
        """Take a connection back: kept if it is fine, else closed with every idle one."""
        if not conn.broken and not conn.closed:
            with contextlib.suppress(psycopg.Error):
                if conn.info.transaction_status != TransactionStatus.IDLE:
                    conn.rollback()  # left in a transaction: never lend it out so
        broken = conn.broken or conn.closed
        keep = not broken and conn.info.transaction_status == TransactionStatus.IDLE
        with self._cond:
            if keep and self._open:
                self._idle.append(conn)
                self._cond.notify()
                return
            dropped = self._idle if broken else []
            if broken:
                self._idle = []
            self._size -= 1 + len(dropped)
            self._cond.notify_all()
        for other in [conn, *dropped]:
            _close(other)


def _close(conn: Conn) -> None:
    with contextlib.suppress(Exception):
        conn.close()
