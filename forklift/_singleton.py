"""Singleton sections: at most one holder across every replica, by advisory lock.

`App.singleton()` and forklift's own maintenance both go through `singleton()`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from forklift import _db, _locks
from forklift._events import emit
from forklift.store import translated

log = logging.getLogger(__name__)


@contextmanager
def singleton(dsn: str, timeouts: _db.Timeouts, name: str) -> Iterator[bool]:
    """Try to hold the lock `name` for the block; yields whether this process got it.

    The lock lives on a dedicated connection (never a pooled one that could go back
    with the lock still held), the try never blocks, and the lock is always released
    when the block ends, however it ends: explicitly, or by closing the connection if
    the release itself fails. The block's own exceptions pass through untouched.
    """
    with translated(f"singleton {name}"):
        # Through a transaction pooler each statement may reach another backend: the
        # lock would stay held on one of them.
        _db.needs_session_url(dsn, timeouts, f"singleton {name}")
        conn = _db.connect(dsn, timeouts, application_name="forklift-singleton")
    try:
        with translated(f"singleton {name}"):
            held = _locks.try_take(conn, name)
        if not held:
            emit(log, "singleton.busy", logging.DEBUG, name=name)  # another replica has it
        try:
            yield held
        finally:
            if held:
                _release(conn, name)
    finally:
        conn.close()


def _release(conn: psycopg.Connection[Any], name: str) -> None:
    try:
        _locks.release(conn, name)
    except psycopg.Error as exc:
        # Closing the session (which follows at once) releases its locks too.
        emit(log, "singleton.release_failed", logging.WARNING, name=name, error=exc)
