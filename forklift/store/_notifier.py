"""Notifying the workers after a quiet enqueue (migration 0010): the Notifier.

A transaction that notifies holds PostgreSQL's notify lock from its commit until its
commit record is flushed, so producers that notify commit one at a time, one WAL flush
each. An enqueue on the producer's own connection therefore commits quietly whenever
another enqueue of the same process is in flight (and a bulk one always does), and its
queues are notified after the commit, from a thread, in a transaction that does not wait
for its flush (the `wake` query): the lock is held for microseconds, and what the
process's threads enqueue while one wake is on the wire goes out together in the next.
An enqueue alone in its process notifies in its own transaction as before: one round
trip and one transaction, the cheapest way to wake the workers when nothing waits behind
it.

The wakes of every App of the process that reach the same database and schema go out
from one thread (a `_Sender`), whichever App's connection is at hand: a threaded web
server often has an App per thread, and with one wake thread each, 8 producers sent
about one wake per enqueue (0.55x the rate of 8 bare INSERTs; sharing, 0.75x).

And one wake at most every WAKE_EVERY (2 ms), the first after a pause at once: 8
producers sent one wake for every 4 jobs, each a transaction and a pool checkout, as
fast as the round trips went. Spaced, one for every 10 (bench.enqueue's 8-producer
case 0.55-0.56x -> 0.60-0.61x the bare INSERTs). A job that another enqueue of the
process overlapped waits for its wake 2 ms more at worst; an enqueue alone notifies in
its own transaction, as above, and is not delayed at all.

A wake is a hint, as every notification here: if it fails (the database went away), the
jobs are committed all the same and an idle worker finds them at its next poll. At exit
(or App.close) what is pending is sent first.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager

from forklift.store._boundary import Conn

log = logging.getLogger(__name__)

FLUSH_TIMEOUT = 2.0  # seconds close() waits for the last wake
WAKE_EVERY = 0.002  # seconds from one wake to the next of a sender, at least

Connect = Callable[[], AbstractContextManager[Conn]]


class _Sender:
    """Sends the wakes of one database and schema from a thread of its own: the queues
    pending, on the connection of the App that asked last (it is open: it has just
    enqueued, and an App's close waits here until what is pending has gone out)."""

    def __init__(self, sql: str) -> None:
        self._sql = sql
        self._changed = threading.Condition()  # guards every field below
        self._pending: set[str] = set()
        self._connection: Connect | None = None
        self._sending = False
        self._thread: threading.Thread | None = None
        self._last = -WAKE_EVERY  # when the last wake went out (monotonic)

    def add(self, queues: Iterable[str], connection: Connect) -> None:
        with self._changed:
            self._pending.update(queues)
            self._connection = connection
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="forklift-notifier", daemon=True
                )
                self._thread.start()
            self._changed.notify_all()

    def flush(self, timeout: float) -> None:
        """Wait up to `timeout` s until nothing is pending or on the wire."""
        with self._changed:
            self._changed.wait_for(lambda: not (self._pending or self._sending), timeout)

    def _run(self) -> None:
        while True:
            with self._changed:
                while not self._pending:
                    self._changed.wait()
            time.sleep(max(0.0, self._last + WAKE_EVERY - time.monotonic()))
            with self._changed:  # with what was asked for meanwhile
                queues, self._pending = sorted(self._pending), set()
                connection, self._sending = self._connection, True
            self._last = time.monotonic()
            try:
                assert connection is not None
                send(connection, self._sql, queues)
            finally:
                with self._changed:
                    self._sending = False
                    if not self._pending:
                        self._connection = None  # no closed App's pool kept alive
                    self._changed.notify_all()


def send(connection: Connect, sql: str, queues: Sequence[str]) -> None:
    """Notify `queues` now; a failure loses the hint, not a job."""
    try:
        with connection() as conn:
            conn.execute(sql, {"queues": queues})
    except Exception as exc:  # a hint lost: idle workers poll
        log.debug("could not wake the workers of %s: %s", ", ".join(queues), exc)


# Per process: enqueues on forklift's own connections in flight, every App's together,
# and one sender per (database, wake query).
_in_flight = 0
_in_flight_lock = threading.Lock()
_senders: dict[tuple[object, str], _Sender] = {}
_senders_lock = threading.Lock()


def _forget_after_fork() -> None:
    # A forked child has none of the parent's threads, and a lock one of them held stays
    # held: it starts with no enqueue in flight and no sender.
    global _in_flight, _in_flight_lock, _senders_lock
    _in_flight, _in_flight_lock = 0, threading.Lock()
    _senders.clear()
    _senders_lock = threading.Lock()


os.register_at_fork(after_in_child=_forget_after_fork)


def _flush_at_exit() -> None:
    deadline_each = FLUSH_TIMEOUT / max(1, len(_senders))
    for sender in list(_senders.values()):
        sender.flush(deadline_each)


atexit.register(_flush_at_exit)  # a producer that never closes its App wakes its last jobs


class Notifier:
    """An App's (a JobStore's) side of the wakes: whether an enqueue commits quietly, and
    its queues handed to the process's sender for `database` once it has."""

    def __init__(self, connection: Connect, sql: str, database: object) -> None:
        self._connection = connection
        self._sql = sql
        self._key = (database, sql)
        self._closed = False

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
        if self._closed:  # the App closed in the meantime: send it from here
            send(self._connection, self._sql, sorted(set(queues)))
            return
        self._sender().add(queues, self._connection)

    def close(self, timeout: float = FLUSH_TIMEOUT) -> None:
        """Wait up to `timeout` s for the pending wakes to go out (they may be on this
        App's connection, about to close)."""
        self._closed = True
        with _senders_lock:
            sender = _senders.get(self._key)
        if sender is not None:
            sender.flush(timeout)

    def _sender(self) -> _Sender:
        with _senders_lock:
            sender = _senders.get(self._key)
            if sender is None:
                sender = _senders[self._key] = _Sender(self._sql)
            return sender
