"""LISTEN/NOTIFY: a notification for one of our queues wakes the claim loop (a hint); an
operator's order on the control channel goes to `on_control` (a cancel, which checks the
database before it stops anything).

Under a supervisor the orders come from its session thread, over a pipe (`PipeSource`),
and the session thread wakes the claim loop for a new job itself: one LISTEN connection
per supervisor, not one per child. A `forklift worker` LISTENs itself
(`JobStore.channel_listen`).
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Protocol

from forklift import _db, _sql
from forklift._events import emit
from forklift._service import TestSignal
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.store import JobStore
from forklift.workers.wakeup import Wakeup

log = logging.getLogger(__name__)


# Between reconnects: 0.5 s, doubling, at most 10 s.
RECONNECT = Backoff(base=0.5, factor=2.0, max=10.0, jitter=0.0)


@dataclass(frozen=True)
class ListenerConfig:
    """How the listener waits, and how it reconnects."""

    # Seconds one wait for notifications lasts before the stop flag is looked at again.
    tick: float = 0.5
    reconnect: Backoff = RECONNECT


class Hints(Protocol):
    """What a listener waits on: (channel, payload) pairs, as `Notifications` gives them."""

    def wait(self, timeout: float) -> Iterator[tuple[str, str]]: ...


class PipeSource:
    """The orders a supervisor's session thread forwards to this child: lines of one kind
    letter (`c`, session.py) and the payload. (A queue's new job does not come this way:
    the session thread wakes the child's claim loop itself, session.HintFanout.)"""

    def __init__(self, fd: int, schema: str) -> None:
        self.fd = fd
        self.control = _sql.control_channel_name(schema)
        self._buffer = b""
        self._eof = False

    @contextmanager
    def open(self) -> Iterator[PipeSource]:
        yield self

    def wait(self, timeout: float) -> Iterator[tuple[str, str]]:
        if self._eof:  # the parent is gone: the parent heartbeat stops this worker
            time.sleep(timeout)
            return
        readable, _, _ = select.select([self.fd], [], [], timeout)
        if not readable:
            return
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""
        if not data:
            self._eof = True
            return
        *lines, self._buffer = (self._buffer + data).split(b"\n")
        for line in lines:
            text = line.decode("utf-8", "replace")
            if text[:1] == "c":
                yield self.control, text[1:]


class Listener:
    """Waits on its hints and wakes the claim loop when one of `queues` gets a job.
    Reconnects with backoff; the claim loop's polling covers the gaps.

    Hints come from `source` (a pipe from the supervisor) or, without one, from a LISTEN
    connection of its own.
    """

    def __init__(
        self,
        store: JobStore,
        dsn: str,
        timeouts: _db.Timeouts,
        queues: Sequence[str],
        wakeup: Wakeup,
        closing: threading.Event,
        config: ListenerConfig | None = None,
        on_control: Callable[[str], object] | None = None,
        source: PipeSource | None = None,
    ) -> None:
        self.store = store
        self.source = source
        self.dsn = dsn
        self.timeouts = timeouts
        self.queues = frozenset(queues)
        self.wakeup = wakeup
        self.closing = closing
        self.config = config or ListenerConfig()
        self.control = _sql.control_channel_name(store.schema)
        self.on_control = on_control
        self.listening: TestSignal[None] = TestSignal()  # each time LISTEN has run
        self.woken: TestSignal[str] = TestSignal()  # the queue of each wake-up
        self._reconnect = Streak(self.config.reconnect)

    def run(self) -> None:
        """Listen until closing, reconnecting after a failure."""
        while not self.closing.is_set():
            try:
                opened: AbstractContextManager[Hints] = (
                    self.source.open()
                    if self.source is not None
                    else self.store.channel_listen(self.dsn, self.timeouts)
                )
                with opened as notes:
                    self._reconnect.succeeded()
                    self.wakeup.set()  # anything sent while we were away: look now
                    self.listening.emit(None)
                    while not self.closing.is_set():
                        self.run_once(notes)
            except DatabaseError as exc:
                if self.closing.is_set():
                    return
                if not _db.transient(exc):  # refused: each reconnect would be refused again
                    emit(log, "listener.refused", logging.ERROR, error=exc)
                    return  # the claim loop's polling serves alone
                delay = self._reconnect.failed()
                emit(log, "listener.reconnect", logging.WARNING, error=exc, retry_in=delay)
                self.closing.wait(delay)

    def run_once(self, notes: Hints) -> int:
        """Wait one tick for notifications; wake the claim loop for each of our queues.

        Returns how many wake-ups it gave.
        """
        woken = 0
        for channel, queue in notes.wait(self.config.tick):
            if channel == self.control:
                if self.on_control is not None:
                    self.on_control(queue)
            elif queue in self.queues or not queue:  # no queue: "look now" (a reconnect)
                self.wakeup.set()
                self.woken.emit(queue)
                woken += 1
        return woken
