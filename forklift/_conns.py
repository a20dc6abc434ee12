"""One connection held open for one thread's calls, reconnected when found dead, and never
closed by a forked child."""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from forklift import _db

Conn = psycopg.Connection[Any]

# Connections held by this process. A forked child inherits their sockets; were it to
# close one through libpq, the Terminate message would end the parent's session. So the
# child drops its copies of the sockets with a bare close(2) and keeps the objects
# referenced for good (they are never finalized, so libpq never writes to them).
_held: weakref.WeakSet[HeldConnection] = weakref.WeakSet()
_abandoned: list[Conn] = []


def _abandon_in_child() -> None:
    for holder in list(_held):
        conn, holder._conn = holder._conn, None
        holder._lock = threading.Lock()  # the parent's thread may have held it
        if conn is None:
            continue
        _abandoned.append(conn)
        try:
            os.close(conn.pgconn.socket)
        except (OSError, psycopg.Error):
            pass


os.register_at_fork(after_in_child=_abandon_in_child)


class HeldConnection:
    """An autocommit connection opened on first use and kept; one found dead (its session
    ended, its socket broken) is replaced on the next use. Quacks like a pool's
    `connection()` for the stores, so one store serves a pool or this."""

    def __init__(self, dsn: str, timeouts: _db.Timeouts, application_name: str) -> None:
        self.conninfo = dsn
        self.timeouts = timeouts
        self.application_name = application_name
        self._conn: Conn | None = None
        self._lock = threading.Lock()
        _held.add(self)

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Conn]:
        """The held connection (connected now if it is not); a psycopg error that
        leaves the block and broke it drops it."""
        with self._lock:
            conn = self._conn
            if conn is None or not _db.looks_alive(conn):
                self._close(conn)
                conn = self._conn = _db.connect(
                    self.conninfo, self.timeouts, application_name=self.application_name
                )
            try:
                yield conn
            except psycopg.Error:
                if conn.broken or conn.closed:
                    self._close(conn)
                    self._conn = None
                raise

    def cancel(self) -> None:
        """Cancel the statement the held connection runs now, if any (from any thread)."""
        conn = self._conn
        if conn is not None and not conn.closed:
            try:
                conn.cancel_safe(timeout=2.0)
            except (psycopg.Error, OSError):
                pass  # ended anyway, or the statement ends on its own bound

    def open(self, wait: bool = False, timeout: float = 30.0) -> None:
        """As a pool's: here the connection opens on first use."""

    def close(self, timeout: float = 5.0) -> None:
        with self._lock:
            self._close(self._conn)
            self._conn = None

    @staticmethod
    def _close(conn: Conn | None) -> None:
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
