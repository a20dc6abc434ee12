"""The store's error boundary: psycopg and pool errors become forklift's DatabaseError."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg

from forklift import _db
from forklift._pool import PoolTimeout
from forklift.errors import DatabaseError

Conn = psycopg.Connection[Any]


@contextmanager
def translated(what: str) -> Iterator[None]:
    """Turn psycopg and pool errors into forklift's DatabaseError, saying `what` failed."""
    try:
        yield
    except PoolTimeout as exc:
        raise DatabaseError(f"{what}: no database connection available: {exc}") from exc
    except psycopg.Error as exc:
        raise DatabaseError(f"{what}: {type(exc).__name__}: {exc}") from exc


@contextmanager
def short_connection(
    dsn: str, timeouts: _db.Timeouts, application_name: str, what: str
) -> Iterator[Conn]:
    """A bounded connection for one piece of work, closed after it; errors translated.

    For callers that must hold no connection between calls (the supervisor across
    forks, one-shot commands, singleton locks, the worker's LISTEN connection).
    """
    with translated(what), _db.connect(dsn, timeouts, application_name=application_name) as c:
        yield c
