"""The store's error boundary: psycopg and pool errors become forklift's DatabaseError,
the psycopg error kept as its cause and classified (transient or not, by SQLSTATE)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import psycopg
from psycopg_pool import PoolTimeout

from forklift import _db
from forklift.errors import DatabaseError, SchemaMissing

Conn = psycopg.Connection[Any]
AsyncConn = psycopg.AsyncConnection[Any]


_RELATION = re.compile(r'(?:relation|schema) "([^".]+)')


def _missing(exc: psycopg.Error, where: str) -> str:
    """`schema "forklift" (...) not found in root@127.0.0.1:5432/test: run forklift migrate`."""
    match = _RELATION.search(str(exc))
    schema = match[1] if match else "?"
    return (
        f'schema "{schema}" (forklift\'s tables) not found{" in " + where if where else ""}: '
        "run forklift migrate"
    )


@contextmanager
def translated(what: str, where: str = "") -> Iterator[None]:
    """Turn psycopg and pool errors into forklift's DatabaseError, saying `what` failed.

    `where` (from `_db.describe`) names the database in the one error an operator fixes
    by running a command: forklift's schema missing there.
    """
    try:
        yield
    except (psycopg.errors.UndefinedTable, psycopg.errors.InvalidSchemaName) as exc:
        raise SchemaMissing(_missing(exc, where)) from exc
    except PoolTimeout as exc:
        at = f" at {where}" if where else ""
        raise DatabaseError(
            f"{what}: no database connection available ({exc}): is the database{at} up?"
        ) from exc
    except psycopg.Error as exc:
        raise classified(f"{what}: {type(exc).__name__}: {exc}", exc) from exc
    except UnicodeEncodeError as exc:  # a lone surrogate in a text parameter
        raise DatabaseError(
            f"{what}: text that is not valid Unicode: {exc}", transient=False, row_dependent=True
        ) from exc


def classified(message: str, exc: psycopg.Error) -> DatabaseError:
    """A DatabaseError saying `message`, raised from `exc` and classified as
    `_db.database_error` does (unavailable or refused, by its SQLSTATE and class)."""
    return _db.database_error(message, exc)


@contextmanager
def connected(
    connect: Callable[[], AbstractContextManager[Conn]], what: str, conn: Conn | None = None
) -> Iterator[Conn]:
    """`conn` if given, else one from `connect`, its errors said as `what` failed (the
    batch and workflow stores' connections)."""
    with translated(what):
        if conn is not None:
            yield conn
        else:
            with connect() as own:
                yield own


@contextmanager
def short_connection(
    dsn: str, timeouts: _db.Timeouts, application_name: str, what: str
) -> Iterator[Conn]:
    """A bounded connection for one piece of work, closed after it; errors translated.

    For callers that must hold no connection between calls (the supervisor across
    forks, one-shot commands, singleton locks, the worker's LISTEN connection).
    """
    with (
        translated(what, _db.describe(dsn)),
        _db.connect(dsn, timeouts, application_name=application_name) as c,
    ):
        yield c


def pipelined(conn: Conn, statements: Sequence[tuple[str, Any]]) -> list[psycopg.Cursor[Any]]:
    """Run `statements` ((query, params)) in one transaction and one round trip: BEGIN and
    COMMIT go as statements of the pipeline (psycopg's transaction() would wait for its
    BEGIN). Each statement's cursor, in order; on an error, rolled back and raised."""
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            cursors = [conn.execute(query, params) for query, params in statements]
            conn.execute("COMMIT")
    except BaseException:
        try:
            conn.rollback()  # a failed statement left the transaction open (aborted)
        except psycopg.Error:
            # Lost mid-pipeline, the connection cannot leave pipeline mode to roll back:
            # closed, the pool replaces it, and the statement's own error is raised.
            conn.close()
        raise
    return cursors
