"""Singleton sections: at most one holder across every replica, by advisory lock."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

from forklift import _db
from forklift.store import short_connection


def lock_key(name: str) -> int:
    """A stable 63-bit advisory-lock key for `name` (include the schema in it)."""
    digest = hashlib.sha256(f"forklift:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


@contextmanager
def singleton(dsn: str, timeouts: _db.Timeouts, name: str) -> Iterator[bool]:
    """Try to hold `name` for the block; yields whether this process got it.

    The lock lives on a dedicated connection (never a pooled one that could go back
    with the lock still held), the try never blocks, and the lock is always released:
    explicitly, or by the connection closing if the release itself fails.
    """
    key = lock_key(name)
    with short_connection(dsn, timeouts, "forklift-singleton", f"singleton {name}") as conn:
        row = conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
        held = bool(row and row[0])
        try:
            yield held
        finally:
            if held:
                conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
