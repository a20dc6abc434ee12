"""Group commit: successes queue up and are completed many per statement, fenced.

The one route of a success without an effect transaction (the other is the effect's
commit, recorder.py): every batch is sent by `_written` and recorded by `_record`. Most
go to the database with the worker's next claim, in its round trip and its transaction
(`riding`): the claim then sees the slots and keys they free, and the two cost one round
trip and one commit. What the claim loop does not take within `linger` (it has no slot
free, or it is stopping), or a claim could not carry, is flushed on the completer's own
thread: retried through an outage for a lease at most, split to find the rows the
database refuses, never retried on an error a retry will not cure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from forklift._events import emit
from forklift._service import TestSignal
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.store import Claim, Completion, JobStore, job_succeeded_among
from forklift.workers.batch_ends import BatchEnds
from forklift.workers.context import JobContext, Writing
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
        self._sending = threading.Lock()  # held from a group commit's intent to its count
        self._retry = Streak(self.config.retry)
        # (id, attempt) of successes whose completion was sent and its answer lost.
        self._unsure: set[tuple[int, int]] = set()

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
        except DatabaseError as exc:
            if exc.transient:
                # Its answer lost, the transaction may have committed: what it
                # completed is looked up, not called lost, when the batch is written.
                self._may_have_committed(batch)
                self.put_back(batch)
                raise
            # The database answered: the claim and its completions were refused and
            # rolled back. Taken again they would be refused again, claim after claim:
            # the completions are written on their own (split to find a bad row), the
            # claim is made again without them.
            self.flush(batch)
            return claim(())
        self._record(batch, done)
        return made

    def _may_have_committed(self, batch: Sequence[JobContext]) -> None:
        with self._changed:
            self._unsure.update((c.job_id, c.attempt) for c in batch)

    def _written(
        self, batch: list[JobContext], write: Callable[[Sequence[Completion]], set[int]]
    ) -> set[int]:
        """Send the completions of `batch` (jobs whose outcome is taken: Holdings) with
        `write`, the claim or a statement of their own, and count its successes; the ids
        it completed. One at a time (`_sending`): the tally shared with the parent holds
        the intent of one group commit, from before it is sent until its successes are
        counted, so that the parent, should this process die meanwhile, looks up and
        counts that commit's jobs."""
        with self._sending:
            self.events.intend(batch)  # a kill before the answer: the parent counts
            done = write([completion(c) for c in batch])
            self.events.count_succeeded([c for c in batch if c.job_id in done])
        for ctx in batch:
            ctx.writing = Writing.WRITTEN
        return done

    def flush(self, batch: list[JobContext]) -> Flushed:
        """Group-commit successes; retry through a database outage until the lease ends.

        A batch the database refuses (bad data in a row: SQLSTATE class 22 or 23) is
        split in halves until the rows it refuses are alone; each of those is written
        once more without its progress, and failing that is recorded as failed, saying
        why, so one bad row never costs the others. An error trying again will not
        cure (a privilege, a statement the database does not know) is not retried.
        Each job is then recorded as succeeded, failed, or lost (its lease was not
        ours any more, or the database stayed away too long).
        """
        outcome = _Outcome()
        self._write(batch, time.monotonic() + self.config.give_up_after, outcome)
        self._retry.succeeded()
        written = [c for c in batch if c.job_id not in outcome.failed]  # not recorded yet
        flushed = self._record(written, outcome.done)
        if outcome.given_up:  # still ours in the database, now forgotten: released
            self.holdings.doubt()
        return flushed

    def _write(self, batch: list[JobContext], give_up_at: float, outcome: _Outcome) -> None:
        """Write `batch`, retrying transient errors until `give_up_at`, splitting it on a
        refused row; what happened to each job goes to `outcome`."""
        while True:
            try:
                outcome.done |= self._written(batch, self._complete)
                return
            except DatabaseError as exc:
                if not exc.transient:
                    self._refused(batch, exc, give_up_at, outcome)
                    return
                self._may_have_committed(batch)  # answer lost: it may have committed
                if time.monotonic() >= give_up_at or self.closing.is_set():
                    emit(log, "job.complete_failed", logging.ERROR, jobs=len(batch), error=exc)
                    outcome.given_up = True
                    return
                time.sleep(self._retry.failed())

    def _refused(
        self, batch: list[JobContext], exc: DatabaseError, give_up_at: float, outcome: _Outcome
    ) -> None:
        """A batch the database refused: split it if a row's values are the cause, else
        give it up at once (the claim loop gives its jobs back to run again)."""
        if not exc.row_dependent:
            emit(
                log, "job.complete_failed", logging.ERROR,
                jobs=len(batch), sqlstate=exc.sqlstate, error=exc,
            )  # fmt: skip
            outcome.given_up = True
            return
        if len(batch) > 1:
            half = len(batch) // 2
            self._write(batch[:half], give_up_at, outcome)
            self._write(batch[half:], give_up_at, outcome)
            return
        (ctx,) = batch
        if ctx.final_progress is not None:
            # Progress is only a report: the job's success is worth more than it.
            emit(log, "job.progress_dropped", logging.WARNING, job=ctx.job_id, error=exc)
            ctx.final_progress = None
            self._write(batch, give_up_at, outcome)
            return
        ended = refused(self.store, self.owner, self.events, ctx, exc)
        if ended and self.ends is not None:
            self.ends.ended([ctx.job.batch_id])
        outcome.given_up |= not ended  # if its failure was not recorded, it is still ours
        outcome.failed.add(ctx.job_id)

    def _complete(self, rows: Sequence[Completion]) -> set[int]:
        return self.store.job_complete_many(rows, self.owner) if rows else set()

    def _record(self, batch: list[JobContext], done: set[int]) -> Flushed:
        """Record each job of a written batch: succeeded (in `done`), or lost. A job
        whose completion may have committed with its answer lost (a connection lost
        mid-statement) and now reads as not ours is looked up: succeeded at its
        attempt, it is ours that succeeded, not a lease lost."""
        with self._changed:  # those whose earlier completion may have committed
            unsure = [(c.job_id, c.attempt) for c in batch if c.job_id not in done]
            unsure = [lease for lease in unsure if lease in self._unsure]
            self._unsure.difference_update((c.job_id, c.attempt) for c in batch)
        found = (confirmed(self.store, unsure) - done) if unsure else set()
        # Counted apart from any intent: an earlier commit of theirs was answered by none.
        self.events.count_succeeded([c for c in batch if c.job_id in found], intended=False)
        done = done | found
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


@dataclass
class _Outcome:
    """What one flush did to each job: completed, or recorded failed."""

    done: set[int] = field(default_factory=set)
    failed: set[int] = field(default_factory=set)
    given_up: bool = False  # some were given up unwritten: maybe still ours in the database


def completion(ctx: JobContext) -> Completion:
    return (ctx.job_id, ctx.attempt, ctx.result_json, ctx.final_progress)


def refused(
    store: JobStore, owner: str, events: JobEvents, ctx: JobContext, exc: DatabaseError
) -> bool:
    """Record the job whose completion the database refused as dead, saying why (as a
    result that cannot be stored is: trying again would be refused again); whether it
    ended so (False: it was not ours any more, or the record failed)."""
    error = f"CompletionError: the job's completion could not be written: {exc}"
    try:
        state = store.job_fail(
            ctx.job_id, ctx.attempt, owner, dead=True, delay=0.0, error=error, traceback=None
        )
    except DatabaseError as failed:
        emit(log, "job.fail_record_failed", logging.ERROR, job=ctx.job_id, error=failed)
        state = None
    ctx.writing = Writing.WRITTEN
    if state is None:
        events.lease_lost(ctx, "completion refused")
        return False
    events.failed(ctx, error, dead=True, retry_in=0.0)
    return True


def confirmed(store: JobStore, unsure: list[tuple[int, int]]) -> set[int]:
    """Of these (id, attempt) leases whose completion was sent and its answer lost, those
    the database says succeeded at that attempt (none if it cannot say now)."""
    try:
        return job_succeeded_among(store, unsure)
    except DatabaseError as exc:
        emit(log, "job.complete_check_failed", logging.WARNING, jobs=len(unsure), error=exc)
        return set()
