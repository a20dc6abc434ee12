"""Singleton sections: at most one holder across every replica, by advisory lock.

`App.singleton()` and forklift's own maintenance both go through `singleton()`.

A session-level advisory lock lives exactly as long as its session: when the server
ends the session (`pg_terminate_backend`, a restart, a fail-over, a dropped network),
the lock is free at once and another replica may enter. Nothing can stop the code that
is already running in the block, so the block is told instead: a watcher thread
notices the lost session within `WATCH_INTERVAL` (at once when the server closes the
socket), the yielded `Singleton` turns false and its `check()` raises SingletonLost.
"""

from __future__ import annotations

import logging
import os
import selectors
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from forklift import _db, _locks
from forklift._events import emit
from forklift.errors import SingletonLost
from forklift.store import translated

log = logging.getLogger(__name__)

# How often the watcher asks the server whether the session still holds the lock. It
# wakes sooner when the socket turns readable: an idle session receives nothing but
# the server's goodbye (a terminated backend, a shutdown) or the connection's end.
WATCH_INTERVAL = 0.5


class Singleton:
    """What `with app.singleton(name) as held:` yields: true while this process holds
    the lock. `acquired`: whether it took the lock on entry; `lost`: whether it had it
    and lost its session since (`lost_reason` says how); `check()` raises
    SingletonLost unless the lock is held, for a long block to call between steps."""

    def __init__(self, name: str, acquired: bool) -> None:
        self.name = name
        self.acquired = acquired
        self.lost_reason: str | None = None
        self._lost = threading.Event()

    @property
    def held(self) -> bool:
        return self.acquired and not self._lost.is_set()

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def __bool__(self) -> bool:
        return self.held

    def __repr__(self) -> str:
        state = "held" if self.held else "lost" if self.lost else "not acquired"
        return f"<Singleton {self.name!r} {state}>"

    def check(self) -> None:
        """Raise SingletonLost unless this process holds the lock now."""
        if self.held:
            return
        if self.lost:
            raise SingletonLost(
                f"singleton {self.name!r} was lost ({self.lost_reason}): another holder "
                "may be inside it now"
            )
        raise SingletonLost(f"singleton {self.name!r} is held by another process")

    def wait_lost(self, timeout: float | None = None) -> bool:
        """Block until the lock is lost (True) or `timeout` seconds pass (False)."""
        return self._lost.wait(timeout)

    def _lose(self, reason: str) -> None:
        if not self._lost.is_set():
            self.lost_reason = reason
            self._lost.set()
            emit(log, "singleton.lost", logging.WARNING, name=self.name, reason=reason)


@contextmanager
def singleton(
    dsn: str, timeouts: _db.Timeouts, name: str, *, interval: float = WATCH_INTERVAL
) -> Iterator[Singleton]:
    """Try to hold the lock `name` for the block; yields a Singleton, true while this
    process holds it (so `if acquired:` reads as before).

    The lock lives on a dedicated connection (never a pooled one that could go back
    with the lock still held), the try never blocks, and the lock is always released
    when the block ends, however it ends: explicitly, or by closing the connection if
    the release itself fails. While the block runs a watcher thread checks the session
    every `interval` seconds (see the module's docstring). The block's own exceptions
    pass through untouched.
    """
    with translated(f"singleton {name}"):
        # Through a transaction pooler each statement may reach another backend: the
        # lock would stay held on one of them.
        _db.needs_session_url(dsn, timeouts, f"singleton {name}")
        conn = _db.connect(dsn, timeouts, application_name="forklift-singleton")
    try:
        with translated(f"singleton {name}"):
            hold = Singleton(name, _locks.try_take(conn, name))
        if not hold.acquired:
            emit(log, "singleton.busy", logging.DEBUG, name=name)  # another replica has it
            yield hold
            return
        watcher = _Watcher(conn, hold, interval)
        try:
            yield hold
        finally:
            watcher.stop()
            if not hold.lost:
                _release(conn, name)
    finally:
        conn.close()


class _Watcher:
    """A thread that asks whether `conn`'s session still holds `hold`'s lock, every
    `interval` seconds and whenever the socket turns readable, until stop(); it marks
    `hold` lost when the answer is no or the session is gone. The block never uses
    `conn`, so the thread has it to itself until stop() has joined it."""

    def __init__(self, conn: psycopg.Connection[Any], hold: Singleton, interval: float) -> None:
        self._conn = conn
        self._hold = hold
        self._interval = interval
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()  # stop() wakes the select at once
        self._thread = threading.Thread(
            target=self._run, name=f"forklift-singleton-watch {hold.name}", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        os.write(self._wake_w, b"x")
        self._thread.join()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _run(self) -> None:
        try:
            socket = self._conn.fileno()
        except psycopg.Error as exc:
            self._hold._lose(f"its connection is closed: {exc}")
            return
        # A selector, not select(): a descriptor past 1023 is fine in a busy process.
        with selectors.DefaultSelector() as selector:
            selector.register(socket, selectors.EVENT_READ)
            selector.register(self._wake_r, selectors.EVENT_READ)
            self._watch(selector, socket)

    def _watch(self, selector: selectors.BaseSelector, socket: int) -> None:
        while not self._stopping.is_set():
            try:
                readable = {key.fd for key, _ in selector.select(self._interval)}
            except OSError as exc:  # the socket is gone
                self._hold._lose(f"its connection failed: {exc}")
                return
            if self._stopping.is_set():
                return
            try:
                held = _locks.held(self._conn, self._hold.name)
            except psycopg.Error as exc:
                self._hold._lose(f"its session ended: {_db.redact(str(exc)).strip()}")
                return
            if not held:
                self._hold._lose("its session no longer holds the lock")
                return
            if socket in readable:
                # Readable yet alive (a notice the check consumed): no busy loop on it.
                self._stopping.wait(self._interval)


def _release(conn: psycopg.Connection[Any], name: str) -> None:
    try:
        _locks.release(conn, name)
    except psycopg.Error as exc:
        # Closing the session (which follows at once) releases its locks too.
        emit(log, "singleton.release_failed", logging.WARNING, name=name, error=exc)
