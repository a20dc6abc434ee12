"""Group commit: successes queue up and are completed many per statement, fenced."""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import NamedTuple

from forklift._events import emit
from forklift._service import TestSignal
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.store import JobStore
from forklift.workers.batch_ends import BatchEnds
from forklift.workers.context import JobContext
from forklift.workers.events import JobEvents
from forklift.workers.holdings import Holdings

log = logging.getLogger(__name__)


# Between tries of a batch through an outage: 0.05 s, doubling, at most 1 s.
RETRY = Backoff(base=0.05, factor=2.0, max=1.0, jitter=0.0)


@dataclass(frozen=True)
class CompleterConfig:
    """How successes are group-committed."""

    batch: int = 1000  # jobs per statement at most
    # Keep retrying a batch through a database outage this long (the lease: after
    # that the jobs are someone else's anyway), waiting `retry` between tries.
    give_up_after: float = 30.0
    retry: Backoff = RETRY


class Flushed(NamedTuple):
    """What one group commit did: the jobs completed, and those found no longer ours."""

    completed: set[int]
    lost: list[int]


class Completer:
    """Takes the jobs whose handler succeeded (without an effect transaction) and
    completes them in batches; the loop runs on its own thread until `stop()`."""

    def __init__(
        self,
        store: JobStore,
        owner: str,
        holdings: Holdings,
        events: JobEvents,
        closing: threading.Event,
        config: CompleterConfig | None = None,
        ends: BatchEnds | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.holdings = holdings
        self.events = events
        self.closing = closing  # once set, a failing batch is given up at once
        self.config = config or CompleterConfig()
        self.ends = ends  # told the batches of the jobs completed, after the commit
        self.flushed: TestSignal[Flushed] = TestSignal()
        self._queue: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self._retry = Streak(self.config.retry)

    def submit(self, ctx: JobContext) -> None:
        """Queue a job whose handler succeeded; its outcome is recorded once flushed."""
        self._queue.put(ctx)

    def stop(self) -> None:
        """Make run() flush everything queued so far, then return."""
        self._queue.put(None)

    def run(self) -> None:
        """Flush batches as successes arrive, until stop()."""
        while True:
            batch, stopped = self._take()
            if batch:
                self.flush(batch)
            if stopped:
                return

    def _take(self) -> tuple[list[JobContext], bool]:
        """Wait for a success, then take what else is queued: (batch, stopped).

        Once stopped, the batch is everything queued, whatever its size.
        """
        first = self._queue.get()
        batch = [] if first is None else [first]
        stopped = first is None
        while stopped or len(batch) < self.config.batch:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                stopped = True
            else:
                batch.append(more)
        return batch, stopped

    def flush(self, batch: list[JobContext]) -> Flushed:
        """Group-commit successes; retry through a database outage until the lease ends.

        Each job is then recorded as succeeded, or as lost if its lease was not ours
        any more (or the database stayed away too long).
        """
        give_up_at = time.monotonic() + self.config.give_up_after
        while True:
            try:
                with self.holdings.statement_lock:
                    # A job released meanwhile (a stop past its grace) is not ours to record.
                    batch = [c for c in batch if not c.finished]
                    self.events.intend(batch)  # a kill before the answer: the parent counts
                    done = (
                        self.store.job_complete_many(
                            [(c.job_id, c.attempt, c.result_json, c.final_progress) for c in batch],
                            self.owner,
                        )
                        if batch
                        else set()
                    )
                    for ctx in batch:
                        ctx.finished = True
                break
            except DatabaseError as exc:
                if time.monotonic() >= give_up_at or self.closing.is_set():
                    emit(log, "job.complete_failed", logging.ERROR, jobs=len(batch), error=exc)
                    done = set()
                    break
                time.sleep(self._retry.failed())
        self._retry.succeeded()
        self.events.count_succeeded([c for c in batch if c.job_id in done])
        lost = []
        for ctx in batch:
            if ctx.job_id in done:
                self.events.succeeded(ctx, counted=True)
            else:
                lost.append(ctx.job_id)
                self.events.lease_lost(ctx, "completion refused")
        if self.ends is not None:
            self.ends.ended(c.job.batch_id for c in batch if c.job_id in done)
        result = Flushed(done, lost)
        self.flushed.emit(result)
        return result
