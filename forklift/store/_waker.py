"""Waking the workers after a quiet enqueue (migration 0010).

A transaction that notifies holds PostgreSQL's notify lock from its commit until its
commit record is flushed, so producers that notify commit one at a time, one WAL flush
each. An enqueue on the producer's own connection therefore commits quietly whenever
another enqueue of the same process is in flight (and a bulk one always does), and the
Waker notifies its queues after the commit, from a thread of its own, in a transaction
that does not wait for its flush (the `wake` query): the lock is held for microseconds,
and what the process's threads enqueue while one wake is on the wire goes out together in
the next. An enqueue alone in its process notifies in its own transaction as before: one
round trip and one transaction, the cheapest way to wake the workers when nothing waits
behind it.

A wake is a hint, as every notification here: if it fails (the database went away), the
jobs are committed all the same and an idle worker finds them at its next poll. At exit
(or App.close) what is pending is sent first.
"""

from __future__ import annotations

import atexit
import logging
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager

from forklift.store._boundary import Conn

log = logging.getLogger(__name__)

FLUSH_TIMEOUT = 2.0  # seconds close() waits for the last wake

# Enqueues on forklift's own connections in flight in this process, every App's together
# (a threaded web server often has an App per thread or per request).
_in_flight = 0
_in_flight_lock = threading.Lock()


class Waker:
    def __init__(self, connection: Callable[[], AbstractContextManager[Conn]], sql: str) -> None:
        self._connection = connection
        self._sql = sql
        self._changed = threading.Condition()  # guards _pending, _closed, _thread
        self._pending: set[str] = set()
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def enqueuing(self, queues: Iterable[str], *, bulk: bool = False) -> Iterator[bool]:
        """Around an enqueue on the store's own connection: whether to commit it quietly
        (`bulk`, or another enqueue of this process, by any App, is in flight); if so,
        once it has committed, wake `queues`."""
        global _in_flight
        with _in_flight_lock:
            quiet = bulk or _in_flight > 0
            _in_flight += 1
        try:
            yield quiet
        finally:
            with _in_flight_lock:
                _in_flight -= 1
        if quiet:  # not on an error: nothing was committed
            self.wake(queues)

    def wake(self, queues: Iterable[str]) -> None:
        """Notify the workers of `queues` soon (their jobs are committed)."""
        with self._changed:
            self._pending.update(queues)
            if self._closed:  # closed in the meantime: send it from here
                pending, self._pending = sorted(self._pending), set()
            else:
                if self._thread is None:
                    self._start()
                self._changed.notify_all()
                return
        self._send(pending)

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Send what is pending (waiting up to `timeout` s), then stop the thread."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)

    def _start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="forklift-waker", daemon=True)
        self._thread.start()
        # A producer that never closes its App still wakes the workers for its last jobs.
        atexit.register(_close_at_exit, weakref.ref(self))

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending and not self._closed:
                    self._changed.wait()
                if not self._pending:
                    return
                queues, self._pending = sorted(self._pending), set()
            self._send(queues)

    def _send(self, queues: list[str]) -> None:
        try:
            with self._connection() as conn:
                conn.execute(self._sql, {"queues": queues})
        except Exception as exc:  # a hint lost: idle workers poll
            log.debug("could not wake the workers of %s: %s", ", ".join(queues), exc)


def _close_at_exit(ref: weakref.ref[Waker]) -> None:
    waker = ref()
    if waker is not None:
        waker.close()
