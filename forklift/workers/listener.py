"""LISTEN/NOTIFY: a notification for one of our queues wakes the claim loop (a hint)."""

from __future__ import annotations

import logging

from forklift._events import emit
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.workers.parts import WorkerParts

log = logging.getLogger(__name__)

# Between reconnects: 0.5 s, doubling, at most 10 s.
RECONNECT = Backoff(base=0.5, factor=2.0, max=10.0, jitter=0.0)


class ListenerMixin(WorkerParts):
    """The listener thread of a Worker: reconnects with backoff; polling covers gaps."""

    def _listen_loop(self) -> None:
        queues = set(self.config.queues)
        assert self._wakeup is not None
        reconnects = Streak(RECONNECT)
        while not self._closing.is_set():
            try:
                with self.store.channel_listen(self.app.dsn, self._timeouts) as notes:
                    reconnects.succeeded()
                    self._wakeup.set()  # anything sent while we were away: look now
                    while not self._closing.is_set():
                        for queue in notes.wait(0.5):
                            if queue in queues:
                                self._wakeup.set()
            except DatabaseError as exc:
                if self._closing.is_set():
                    return
                delay = reconnects.failed()
                emit(log, "listener.reconnect", logging.WARNING, error=exc, retry_in=delay)
                self._closing.wait(delay)
