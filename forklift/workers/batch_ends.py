"""Finishing batches: at once after a worker commits the end of one of their jobs, and
by a sweep for the ends nobody followed up (a worker killed right after its commit, a
database gone between the two, a job charged by a supervisor).

Either way `BatchStore.finish` decides, under the batch's lock, after seeing none of
its jobs open: the callback goes in once, whoever asks and however often.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from forklift._events import emit
from forklift._service import Repeats
from forklift.errors import DatabaseError
from forklift.metrics import Tally, Totals
from forklift.store import JobStore
from forklift.store.batches import BatchStore, Finished
from forklift.store.workflows import WorkflowStore
from forklift.workers.config import WorkerConfig
from forklift.workers.holdings import Holdings

log = logging.getLogger(__name__)


def _report(finished: dict[int, Finished], tally: Tally | Totals | None) -> None:
    for batch_id, done in finished.items():
        emit(
            log,
            "batch.finished",
            batch=batch_id,
            outcome=done.outcome,
            callback=done.callback_job_id,
            callback_delay=round(done.delay, 4),
        )
        if tally is not None:
            tally.batch(done.outcome, done.delay)


class BatchEnds:
    """Told the batches of jobs whose end a worker just committed; finishes the done ones.

    A batch of which this worker still holds a job is not done (that job is running
    under this worker's lease): it is not asked about, which spares most completions of
    a big batch the question. Whoever ends that job asks, or, if its lease is lost, the
    sweep. A failure is logged (once per kind in a row) and left to the sweep.
    """

    def __init__(
        self,
        batches: BatchStore,
        tally: Tally | None = None,
        holding: Callable[[], Iterable[int | None]] = tuple,
    ) -> None:
        self.batches = batches
        self.tally = tally
        self.holding = holding  # the batches of the jobs this worker holds now
        self._errors = Repeats()

    @classmethod
    def of_worker(cls, store: JobStore, tally: Tally | None, holdings: Holdings) -> BatchEnds:
        """A worker's: on its own connection, sparing the batches of the jobs it holds."""
        batches = BatchStore(store.pool.connection, store.schema)
        return cls(batches, tally, lambda: [c.job.batch_id for c in holdings.snapshot()])

    def ended(self, batch_ids: Iterable[int | None]) -> None:
        ids = {b for b in batch_ids if b is not None}
        if ids:
            ids.difference_update(self.holding())
        if not ids:
            return
        try:
            finished = self.batches.finish_if_done(ids)
        except DatabaseError as exc:
            if self._errors.worth_logging(exc):
                emit(log, "batch.finish_failed", logging.WARNING, batches=len(ids), error=exc)
            return
        _report(finished, self.tally)


ABANDON_AFTER = 3600.0  # seconds after its last enqueue a batch still filling is abandoned


class BatchSweep:
    """Every `every` seconds, seals as abandoned up to `limit` batches still filling
    `abandon_after` seconds after their last enqueue (their producer died inside its
    batch block: nothing else would ever seal them), looks at up to `limit` open sealed
    batches (from where the last round stopped, so all are looked at in turn) and
    finishes the done ones; and as many open workflows (workflow_sweep)."""

    def __init__(
        self,
        batches: BatchStore,
        totals: Tally | Totals | None = None,
        *,
        every: float = 1.0,
        limit: int = 500,
        abandon_after: float = ABANDON_AFTER,
    ) -> None:
        self.batches = batches
        self.totals = totals
        self.every = every
        self.limit = limit
        self.abandon_after = abandon_after
        self.workflows = WorkflowStore(batches.connect, batches.schema)
        self._after = 0
        self._workflows_after = 0
        self._next = time.monotonic()

    @classmethod
    def of(
        cls, batches: BatchStore, totals: Tally | Totals | None, config: WorkerConfig
    ) -> BatchSweep:
        """The sweep a worker's (or a supervisor's) `config` asks for."""
        return cls(batches, totals, abandon_after=config.batch_abandon_after)

    def due(self, now: float) -> bool:
        return now >= self._next

    def run_once(self) -> int:
        """One round: how many batches it finished."""
        self._next = time.monotonic() + self.every
        abandoned = self.batches.abandon(self.abandon_after, self.limit)
        for batch_id in abandoned:
            emit(
                log, "batch.abandoned", logging.WARNING, batch=batch_id,
                reason=f"still filling {self.abandon_after:g} s after its last enqueue",
            )  # fmt: skip
        ids = self.batches.sweep_ids(self._after, self.limit)
        self._after = ids[-1] if len(ids) == self.limit else 0
        finished = self.batches.finish_if_done(set(ids) | set(abandoned))
        _report(finished, self.totals)
        # Workflows whose last two jobs ended at once, each seeing the other open.
        looked, done = self.workflows.sweep(self._workflows_after, self.limit)
        self._workflows_after = looked[-1] if len(looked) == self.limit else 0
        if done:
            emit(log, "workflow.swept", finished=done)
        return len(finished)
