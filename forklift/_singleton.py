"""Singleton sections: at most one holder across every replica, by advisory lock."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from forklift import _db, _locks
from forklift.store import short_connection


@contextmanager
def singleton(dsn: str, timeouts: _db.Timeouts, name: str) -> Iterator[bool]:
    """Try to hold `name` for the block; yields whether this process got it.

    The lock lives on a dedicated connection (never a pooled one that could go back
    with the lock still held), the try never blocks, and the lock is always released:
    explicitly, or by the connection closing if the release itself fails.
    """
    with short_connection(dsn, timeouts, "forklift-singleton", f"singleton {name}") as conn:
        held = _locks.try_take(conn, name)
        try:
            yield held
        finally:
            if held:
                _locks.release(conn, name)
