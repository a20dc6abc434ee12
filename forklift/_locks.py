"""Session-level advisory locks: stable keys from names, and the statements that take them."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import psycopg

from forklift import _db, _sql


def lock_key(name: str) -> int:
    """A stable 63-bit advisory-lock key for `name` (include the schema in it).

    From SHA-256, not hash(): the same on every process, host and Python version.
    """
    digest = hashlib.sha256(f"forklift:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def _queries() -> dict[str, str]:
    return _sql.load("forklift", "locks.sql", "forklift")  # the statements name no schema


def wait(conn: psycopg.Connection[Any], name: str) -> None:
    """Take the lock `name` on `conn`, waiting as long as the statement timeout allows."""
    conn.execute(_queries()["lock_wait"], {"key": lock_key(name)})


def try_take(conn: psycopg.Connection[Any], name: str) -> bool:
    """Take the lock `name` on `conn` if it is free; never waits."""
    return bool(_db.scalar(conn.execute(_queries()["lock_try"], {"key": lock_key(name)})))


def release(conn: psycopg.Connection[Any], name: str) -> None:
    conn.execute(_queries()["lock_release"], {"key": lock_key(name)})


def held(conn: psycopg.Connection[Any], name: str) -> bool:
    """Whether the session of `conn` holds the lock `name` (a round trip: a ping too)."""
    return bool(_db.scalar(conn.execute(_queries()["lock_held"], {"key": lock_key(name)})))


def held_by_anyone(conn: psycopg.Connection[Any], names: Sequence[str]) -> set[str]:
    """Which of the locks `names` any session of this database holds now."""
    keys = {lock_key(n): n for n in names}
    found = _db.scalars(conn.execute(_queries()["lock_held_many"], {"keys": list(keys)}))
    return {keys[key] for key in found}


def liveness(schema: str, owner: str) -> str:
    """The name of the liveness lock a worker process holds while it lives (see
    workers/liveness.py): keyed by its lease owner id, within its schema."""
    return f"liveness:{schema}:{owner}"
