"""Group commit: successes queue up and are completed many per statement, fenced."""

from __future__ import annotations

import logging
import queue
import time

from forklift._events import emit
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.workers.context import JobContext
from forklift.workers.parts import WorkerParts

log = logging.getLogger(__name__)

_COMPLETE_BATCH = 1000
# Between tries of a batch through an outage: 0.05 s, doubling, at most 1 s.
RETRY = Backoff(base=0.05, factor=2.0, max=1.0, jitter=0.0)


class CompleterMixin(WorkerParts):
    """The completer thread of a Worker: drains `_done`, completes in batches."""

    _done: queue.SimpleQueue[JobContext | None]

    def _complete_loop(self) -> None:
        while True:
            first = self._done.get()
            if first is None:
                self._flush_all_pending()
                return
            batch = [first]
            while len(batch) < _COMPLETE_BATCH:
                try:
                    more = self._done.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._flush(batch)
                    self._flush_all_pending()
                    return
                batch.append(more)
            self._flush(batch)

    def _flush_all_pending(self) -> None:
        rest = []
        while True:
            try:
                ctx = self._done.get_nowait()
            except queue.Empty:
                break
            if ctx is not None:
                rest.append(ctx)
        if rest:
            self._flush(rest)

    def _flush(self, batch: list[JobContext]) -> None:
        """Group-commit successes; retry through a database outage until the lease ends."""
        give_up_at = time.monotonic() + self.config.lease
        retries = Streak(RETRY)
        while True:
            try:
                with self._flush_lock:
                    done = self.store.job_complete_many(
                        [(c.job_id, c.attempt) for c in batch], self.owner
                    )
                    for ctx in batch:
                        ctx.finished = True
                break
            except DatabaseError as exc:
                if time.monotonic() >= give_up_at or self._closing.is_set():
                    emit(log, "job.complete_failed", logging.ERROR, jobs=len(batch), error=exc)
                    done = set()
                    break
                time.sleep(retries.failed())
        for ctx in batch:
            if ctx.job_id in done:
                self._succeeded(ctx)
            else:
                self._lease_lost(ctx, "completion refused")
