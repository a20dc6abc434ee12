"""Waiting for a job or a batch to end: LISTEN on the waiters' channel, and read the row
again on every hint and every POLL seconds (a hint may be lost, or forged: it is never
taken for the answer)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from forklift import _db
from forklift.store import Conn, short_connection, translated
from forklift.store.batches import BatchStore

T = TypeVar("T")

POLL = 0.5  # seconds between reads when no hint comes (lost, or through a pooler)


def wait_for_end(
    dsn: str,
    store: BatchStore,
    hint: str,
    check: Callable[[Conn | None], T | None],
    timeout: float,
    mark: Callable[[Conn], None] | None = None,
) -> T | None:
    """`check()` until it gives an answer or `timeout` seconds pass (None then).

    The first check runs on the store's connections, and is the only one with a timeout
    of 0. Then a dedicated session connection LISTENs, `mark`s the row waited for (so
    its end notifies) and checks again before each wait: an end committed between the
    first check and the LISTEN is read, never missed.
    """
    found = check(None)
    if found is not None or timeout <= 0:
        return found
    deadline = time.monotonic() + timeout
    session = _db.session_dsn(dsn)
    with short_connection(session, _db.Timeouts(), "forklift-wait", "waiting failed") as conn:
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
