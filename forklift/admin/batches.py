"""The operator's batches (forklift batches list|show|cancel): what follows from a batch's
row and its jobs' counts (how far, how fast, when done), read through the batch store
(store/batches.py, the only caller of the batch queries) over short bounded connections
(or a Connector's session)."""

from __future__ import annotations

from dataclasses import dataclass

from forklift._bounds import DEAD_SHOWN
from forklift._ids import operator
from forklift.admin._connect import Connector
from forklift.admin.jobs import TIMEOUTS, JobAdmin
from forklift.admin.rows import JobDetail
from forklift.errors import BatchNotFound, JobNotFound
from forklift.store.batches import BatchCounts, BatchRow, CancelledJob


@dataclass(frozen=True)
class BatchSummary:
    """A batch with its jobs by state, and what follows from them: how far it is, how fast
    it goes, when it should be done."""

    row: BatchRow
    counts: BatchCounts

    def count(self, state: str) -> int:
        return self.counts.by_state.get(state, 0)

    @property
    def state(self) -> str:
        """filling (its producer still adds jobs), open (sealed, jobs left) or finished."""
        if self.row.finished_at is not None:
            return "finished"
        return "open" if self.row.sealed_at is not None else "filling"

    @property
    def pending(self) -> int:
        """Its jobs still to run or running."""
        return self.count("ready") + self.count("running")

    @property
    def done(self) -> int:
        """Its jobs that ended (succeeded, dead or cancelled): all it counts but those
        pending, so a finished job purged early still counts as done."""
        return max(0, self.row.total - self.pending)

    @property
    def percent(self) -> float | None:
        """Of its jobs, how many ended, in percent; None for a batch of none."""
        return None if self.row.total <= 0 else 100.0 * self.done / self.row.total

    @property
    def elapsed(self) -> float:
        """Seconds from its creation to its end, or to now while it is not finished."""
        end = self.row.finished_at or self.row.now
        return max(0.0, (end - self.row.created_at).total_seconds())

    @property
    def age(self) -> float:
        """Seconds since it was created."""
        return max(0.0, (self.row.now - self.row.created_at).total_seconds())

    @property
    def rate(self) -> float | None:
        """Jobs ended per second since it was created; None before any ended."""
        if self.done == 0 or self.elapsed <= 0:
            return None
        return self.done / self.elapsed

    @property
    def eta(self) -> float | None:
        """Seconds until its pending jobs end at its rate so far; None when finished, or
        when nothing ended yet to measure a rate by."""
        rate = self.rate
        if self.state == "finished" or rate is None:
            return None
        return self.pending / rate


@dataclass(frozen=True)
class BatchDetail:
    """One batch, everything `forklift batches show` tells of it."""

    summary: BatchSummary
    callback: str | None  # the callback job as the batch keeps it (JSON text); None: none
    callback_job: JobDetail | None  # once enqueued (None: not yet, none, or pruned)
    dead: list[tuple[int, str | None]]  # its first dead jobs: id, last error


@dataclass(frozen=True)
class BatchCancelled:
    """What cancelling a batch did: `refused` when it had finished (nothing was done);
    else whether this call marked it cancelled (False: it was marked before), the jobs
    it cancelled (its ready and running ones), and the batch as it is after."""

    refused: bool
    marked: bool
    jobs: list[CancelledJob]
    after: BatchSummary

    def cancelled(self, was: str) -> int:
        return sum(1 for a in self.jobs if a.done and a.was == was)


class BatchAdmin:
    """Short, bounded connections, one per call (or the `connector`'s session, shared with
    other stores); psycopg errors come out as DatabaseError."""

    def __init__(self, dsn: str, schema: str, connector: Connector | None = None) -> None:
        self.schema = schema
        self.connector = connector or Connector(dsn, TIMEOUTS)
        self.jobs = JobAdmin(dsn, schema, self.connector)
        self.store = self.jobs.batches

    def batch_list(
        self, limit: int, *, exact: bool = True
    ) -> tuple[list[BatchSummary], list[BatchSummary]]:
        """Up to `limit` open batches, newest first, and up to `limit` finished ones, the
        latest to finish first; each with its jobs counted (through the batch indexes;
        not `exact`: tallied, see `BatchStore.tally_many`)."""
        with self.connector.session("listing batches failed"):
            open_, done = self.store.list_open(limit), self.store.list_finished(limit)
            if exact:
                return [self._summary(r) for r in open_], [self._summary(r) for r in done]
            tallies = self.store.tally_many(open_ + done)
            return (
                [BatchSummary(r, tallies[r.id]) for r in open_],
                [BatchSummary(r, tallies[r.id]) for r in done],
            )

    def batch_summary(self, batch_id: int) -> BatchSummary:
        """The batch with its counts; BatchNotFound if there is none."""
        with self.connector.session("reading the batch failed"):
            return self._find(batch_id)

    def batch_get(self, batch_id: int, *, exact: bool = True) -> BatchDetail:
        """Everything about one batch; BatchNotFound if there is none (not `exact`: its
        jobs tallied, see `BatchStore.tally_many`)."""
        with self.connector.session("reading the batch failed"):
            summary = self._find(batch_id, exact)
            callback = self.store.callback(batch_id)
            dead = list(self.store.dead(batch_id, first=DEAD_SHOWN).items())
            return BatchDetail(summary, callback, self._job(summary.row.callback_job_id), dead)

    def batch_cancel(self, batch_id: int, why: str = "", by: str | None = None) -> BatchCancelled:
        """Mark the batch cancelled (by `by`, default this user@host, for `why`) and
        cancel its ready and running jobs (a running one as `forklift jobs cancel` does:
        its worker is told to stop; their checkpoints cleared); BatchNotFound if there is
        none. A finished batch is left as it is (nothing is cancelled): see `after`."""
        with self.connector.session("cancelling the batch failed"):
            before = self._find(batch_id)
            if before.state == "finished":
                return BatchCancelled(True, False, [], before)
            marked, jobs = self.store.cancel(batch_id, by or operator(), why)
            after = self._find(batch_id)
        # Not marked, and no one else's mark: it finished between the two reads.
        refused = not marked and after.row.cancelled_at is None
        return BatchCancelled(refused, marked, jobs, after)

    def _find(self, batch_id: int, exact: bool = True) -> BatchSummary:
        row = self.store.get(batch_id)
        if row is None:
            raise BatchNotFound(f"no batch {batch_id} in schema {self.schema}")
        return self._summary(row, exact)

    def _summary(self, row: BatchRow, exact: bool = True) -> BatchSummary:
        if exact:
            return BatchSummary(row, self.store.counts(row.id))
        return BatchSummary(row, self.store.tally_many([row])[row.id])

    def _job(self, job_id: int | None) -> JobDetail | None:
        if job_id is None:
            return None
        try:
            return self.jobs.job_get(job_id)
        except JobNotFound:
            return None  # pruned (or purged) before its batch
