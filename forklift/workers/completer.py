"""Group commit: successes queue up and are completed many per statement, fenced.

Most go to the database with the worker's next claim, in its round trip and its
transaction (`riding`): the claim then
sees the slots and keys they free, and the two cost one round trip and one commit. What
the claim loop does not take within `linger` (it has no slot free, or it is stopping) is
flushed on the completer's own thread.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from forklift._events import emit
from forklift._service import TestSignal
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.store import Claim, Completion, JobStore
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
    # How long a success waits for the claim loop to take it before this thread writes
    # it alone: a claim is on its way within microseconds of a handler's return unless
    # the worker has no slot to fill (while a claim is on its way, the wait starts when
    # it is back: the loop claims again at once if it has slots).
    linger: float = 0.002


class Flushed(NamedTuple):
    """What one group commit did: the jobs completed, and those found no longer ours."""

    completed: set[int]
    lost: list[int]


class Completer:
    """Takes the jobs whose handler succeeded (without an effect transaction) and
    completes them in batches: with the next claim, or on its own thread (`run()`, until
    `stop()`)."""

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
        self._pending: list[JobContext] = []
        self._since = 0.0  # when the oldest pending success was submitted (monotonic)
        self._stopped = False
        self._riding = False  # a claim that takes successes with it is on its way
        self._no_claim = False  # the claim loop waits for news: no claim will take them
        self._held = False  # a claim goes ahead of what is queued (ahead_of)
        self._changed = threading.Condition()
        self._retry = Streak(self.config.retry)

    def submit(self, ctx: JobContext) -> None:
        """Queue a job whose handler succeeded; its outcome is recorded once flushed."""
        with self._changed:
            if not self._pending:
                self._since = time.monotonic()
            self._pending.append(ctx)
            self._changed.notify()

    def take(self) -> list[JobContext]:
        """The successes queued now (up to a batch), taken to be written elsewhere."""
        with self._changed:
            batch = self._pending[: self.config.batch]
            del self._pending[: self.config.batch]
            self._since = time.monotonic()
        return batch

    def put_back(self, batch: list[JobContext]) -> None:
        """Successes taken that were not written: flushed here after all."""
        with self._changed:
            self._pending[:0] = batch
            self._changed.notify()

    def no_claim_coming(self, on: bool) -> None:
        """The claim loop waits for news (its last claim drained the queue): successes
        are written at once, not after `linger`, since no claim is on its way to take
        them; and written so, they are not in the way of the claim that news brings."""
        with self._changed:
            self._no_claim = on
            if on:  # off (the news came), nothing is to be written sooner
                self._nudge()

    def stop(self) -> None:
        """Make run() flush everything queued so far, then return."""
        with self._changed:
            self._stopped = True
            self._changed.notify()

    def run(self) -> None:
        """Flush what the claim loop leaves, until stop() (then everything queued)."""
        while True:
            batch, stopped = self._take_lingered()
            if batch:
                self.flush(batch)
            if stopped:
                return

    def _take_lingered(self) -> tuple[list[JobContext], bool]:
        """Wait for successes the claim loop did not take within `linger`; take them:
        (batch, stopped). Once stopped, the batch is everything queued."""
        with self._changed:
            while True:
                if self._stopped:
                    batch, self._pending = self._pending, []
                    return batch, True
                if self._pending and not self._riding and not self._held:
                    linger = 0.0 if self._no_claim else self.config.linger
                    left = self._since + linger - time.monotonic()
                    if left <= 0:
                        batch = self._pending[: self.config.batch]
                        del self._pending[: self.config.batch]
                        self._since = time.monotonic()
                        return batch, False
                    self._changed.wait(left)
                else:  # nothing, or a claim on its way that the loop follows up
                    self._changed.wait()

    def riding(self, claim: Callable[[Sequence[Completion]], Claim]) -> Claim:
        """Make `claim` with the successes queued now, which it completes in its
        transaction, then record their outcomes; if it fails, they are flushed here
        after all."""
        with self._changed:
            self._riding = True  # what comes meanwhile waits for the next claim
        try:
            return self._ride(claim)
        finally:
            with self._changed:
                self._riding = False
                self._since = time.monotonic()
                self._nudge()

    def ahead_of(self, claim: Callable[[], Claim]) -> Claim:
        """Make `claim` without the successes queued: they wait until `let_go()` (the
        claim's jobs handed to their runners first), then are written on this thread.
        For a claim that every slot waits on (nothing runs, nothing claimed waits): its
        jobs start before the successes' commit, not after it. Riding, the completion
        ran first in the claim's transaction, cold after a long job: a median gap of
        2.39 ms between two 50 ms jobs of a CPU-bound worker, 1.65 ms this way
        (bench.cpu). Every claim made this way must be followed by `let_go()`."""
        with self._changed:
            self._held = True
        try:
            return claim()
        except BaseException:
            self.let_go()
            raise

    def let_go(self) -> None:
        """Write the successes `ahead_of` held back, now."""
        with self._changed:
            if self._held:
                self._held = False
                self._since = 0.0  # their linger is over: the claim went instead
                self._nudge()

    def _nudge(self) -> None:
        """Wake run() to look again (under `_changed`), if anything is queued: with
        nothing, it has nothing to do (a success queued wakes it then), and woken for
        nothing after every claim, and again as news came, it took the GIL from the
        claim and the jobs it took."""
        if self._pending:
            self._changed.notify()

    def _ride(self, claim: Callable[[Sequence[Completion]], Claim]) -> Claim:
        batch = self.take()
        if not batch:
            return claim(())
        made = Claim([])

        def write(rows: Sequence[Completion]) -> set[int]:
            nonlocal made
            made = claim(rows)
            return made.completed

        try:
            done = self._written(batch, write)
        except DatabaseError:
            self.put_back(batch)
            raise
        self._record(batch, done)
        return made

    def _written(
        self, batch: list[JobContext], write: Callable[[Sequence[Completion]], set[int]]
    ) -> set[int]:
        with self.holdings.statement_lock:
            # A job released meanwhile (a stop past its grace) is not ours to record.
            batch[:] = [c for c in batch if not c.finished]
            self.events.intend(batch)  # a kill before the answer: the parent counts
            done = write([completion(c) for c in batch])
            for ctx in batch:
                ctx.finished = True
        return done

    def flush(self, batch: list[JobContext]) -> Flushed:
        """Group-commit successes; retry through a database outage until the lease ends.

        Each job is then recorded as succeeded, or as lost if its lease was not ours
        any more (or the database stayed away too long).
        """
        give_up_at = time.monotonic() + self.config.give_up_after
        while True:
            try:
                done = self._written(batch, self._complete)
                break
            except DatabaseError as exc:
                if time.monotonic() >= give_up_at or self.closing.is_set():
                    emit(log, "job.complete_failed", logging.ERROR, jobs=len(batch), error=exc)
                    done = set()
                    break
                time.sleep(self._retry.failed())
        self._retry.succeeded()
        return self._record(batch, done)

    def _complete(self, rows: Sequence[Completion]) -> set[int]:
        return self.store.job_complete_many(rows, self.owner) if rows else set()

    def _record(self, batch: list[JobContext], done: set[int]) -> Flushed:
        """Record each job of a written batch: succeeded (in `done`), or lost."""
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


def completion(ctx: JobContext) -> Completion:
    return (ctx.job_id, ctx.attempt, ctx.result_json, ctx.final_progress)
