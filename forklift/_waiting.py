"""Waiting for a job or a batch to end: LISTEN on the waiters' channel, and read the row
again on every hint and every POLL seconds (a hint may be lost, or forged: it is never
taken for the answer)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import TypeVar

import psycopg

from forklift import _db
from forklift.store import Conn, short_connection, translated
from forklift.store.batches import BatchStore

T = TypeVar("T")
Connect = Callable[[], AbstractContextManager[Conn]]

POLL = 0.5  # seconds between reads when no hint comes (lost, or through a pooler)


def listener(dsn: str, pooled: Connect) -> Connect:
    """Where a waiter LISTENs: a connection of `pooled` (one already open, so a wait
    costs no connect), or, when the database URL leads through a transaction pooler
    (a session URL is set beside it), a session connection of its own."""
    session = _db.session_dsn(dsn)
    if session == dsn:
        return pooled

    @contextmanager
    def own() -> Iterator[Conn]:
        with short_connection(session, _db.Timeouts(), "forklift-wait", "waiting failed") as c:
            yield c

    return own


def wait_for_end(
    connect: Connect,
    store: BatchStore,
    hint: str,
    check: Callable[[Conn], T | None],
    timeout: float,
    mark: Callable[[Conn], None] | None = None,
) -> T | None:
    """`check()` until it gives an answer or `timeout` seconds pass (None then).

    With time to wait, the connection LISTENs, `mark`s the row waited for (so its end
    notifies) and checks again before each wait: an end committed between the first
    check and the LISTEN is read, never missed. The connection stops listening before
    it goes back to its pool.
    """
    deadline = time.monotonic() + timeout
    with connect() as conn:
        found = check(conn)
        if found is not None or timeout <= 0:
            return found
        try:
            store.done_listen(conn)
            if mark is not None:
                mark(conn)
            while True:
                found = check(conn)
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                with translated("waiting failed"):
                    for note in conn.notifies(timeout=min(POLL, left)):
                        if note.payload == hint:
                            break
        finally:
            with suppress(psycopg.Error):
                conn.execute("UNLISTEN *")
