"""The operator's job store: the only caller of admin/jobs.sql (list, show, retry, purge,
and what `forklift top` reads of jobs; a cancel is the batch store's, which a batch's
cancel runs too), over short bounded connections (or a Connector's session)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import NamedTuple

from forklift import _db, _sql
from forklift._bounds import BATCH, LIST_WINDOW
from forklift._ids import operator
from forklift.admin._connect import Connector
from forklift.admin.rows import (
    Acted,
    Checkpoint,
    DeadJob,
    FinishedMinute,
    JobDetail,
    JobFilter,
    JobPage,
    JobRow,
    Progress,
    Purged,
    RunningJobRow,
)
from forklift.errors import JobNotFound
from forklift.store.batches import BatchStore

# A purge batch or a bulk retry may take a few seconds on a big table; still bounded.
TIMEOUTS = _db.Timeouts(connect=2.0, statement=5.0, lock=2.0)


# job_get's first columns: a JobRow's.
_JOB_ROW = tuple(f.name for f in fields(JobRow))


class Window(NamedTuple):
    """What job_list_window read: how many jobs the window held, the oldest id in it."""

    scanned: int
    oldest: int | None


class JobAdmin:
    """Short, bounded connections, one per call (or the `connector`'s session, shared with
    other stores); psycopg errors come out as DatabaseError."""

    def __init__(self, dsn: str, schema: str, connector: Connector | None = None) -> None:
        self.schema = schema
        self.connector = connector or Connector(dsn, TIMEOUTS)
        self.q = _sql.load("forklift.admin", "jobs.sql", schema)
        self.batches = BatchStore(lambda: self.connector.conn("batch query failed"), schema)

    def job_list(
        self, where: JobFilter, *, limit: int, before: int | None, window: int = LIST_WINDOW
    ) -> JobPage:
        """Up to `limit` jobs matching `where`, newest first, older than `before`."""
        scheduled = where.state == "scheduled"  # ready, due later (status's column)
        params = {
            "state": "ready" if scheduled else where.state,
            "scheduled": scheduled,
            "queue": where.queue,
            "task": where.task,
            "error": where.pattern,
            "before": before,
            "window": window,
            "limit": limit + 1,  # one more than shown: is there a next page?
        }
        with self.connector.conn("listing jobs failed") as conn:
            jobs = _db.rows(conn.execute(self.q["job_list"], params), JobRow)
            if len(jobs) > limit:
                return JobPage(jobs[:limit], jobs[limit - 1].id)
            scanned = _db.one(conn.execute(self.q["job_list_window"], params), Window)
        assert scanned is not None
        # Short, and the window was full: older jobs may match too.
        return JobPage(jobs, scanned.oldest if scanned.scanned == window else None)

    def job_get(self, job_id: int) -> JobDetail:
        """Everything about one job; JobNotFound if there is none."""
        with self.connector.conn("reading the job failed") as conn:
            found = _db.one(conn.execute(self.q["job_get"], {"id": job_id}), dict)
        if found is None:
            raise JobNotFound(f"no job {job_id} in schema {self.schema}")
        # Its columns: JobRow's, then JobDetail's own.
        job = JobRow(**{name: found.pop(name) for name in _JOB_ROW})
        progress = Progress.of(found.pop("progress"))
        checkpoint = Checkpoint.of(found.pop("checkpoint"), found.pop("checkpoint_at"))
        return JobDetail(job, progress=progress, checkpoint=checkpoint, **found)

    def job_retry_many(
        self, ids: Sequence[int], by: str | None = None, *, from_scratch: bool = False
    ) -> list[Acted]:
        """Dead or cancelled jobs back to ready now, attempts and crashes reset to 0, the
        retry noted in their error history as by `by` (default: this user@host). A job's
        checkpoint is kept (it resumes from it), or with `from_scratch` cleared.

        One Acted per id asked for, in id order: done, or why not (its state; None if
        there is no such job).
        """
        found: dict[int, Acted] = {}
        with self.connector.conn("retrying jobs failed") as conn:
            for batch in _batches(sorted(set(ids))):
                params = {"ids": batch, "by": by or operator(), "scratch": from_scratch}
                for acted in _db.rows(conn.execute(self.q["job_retry_many"], params), Acted):
                    found[acted.id] = acted
        return [found.get(i, Acted(i, False, None)) for i in sorted(set(ids))]

    def job_dead_ids(self, queue: str | None, task: str | None) -> Iterator[list[int]]:
        """Every dead job's id (of a queue, of a task), a batch at a time, in id order."""
        after = 0
        while True:
            params = {"after": after, "queue": queue, "task": task, "limit": BATCH}
            with self.connector.conn("finding dead jobs failed") as conn:
                batch: list[int] = _db.scalars(conn.execute(self.q["job_dead_ids"], params))
            if not batch:
                return
            yield batch
            after = batch[-1]

    def job_cancel_many(self, ids: Sequence[int], by: str | None = None) -> list[Acted]:
        """Cancel ready and running jobs now, their checkpoints cleared (a cancelled job
        does not resume); a running job's worker is told to stop. The error history says
        by whom: `by` (default: this user@host).

        One Acted per id asked for, in id order (`owner`: who was running it).
        """
        found = {
            c.id: Acted(c.id, c.done, c.was, owner=c.owner)
            for c in self.batches.job_cancel_many(ids, by or operator())
        }
        return [found.get(i, Acted(i, False, None)) for i in sorted(set(ids))]

    def job_purge(
        self, state: str, older_than: float, *, dry_run: bool, max_batches: int | None = None
    ) -> Purged:
        """Delete jobs of a finished state completed more than `older_than` seconds ago,
        a short transaction per batch (or, in a dry run, count them); at most
        `max_batches` batches when given (`more`: it stopped there)."""
        with self.connector.conn("purging jobs failed") as conn:
            cutoff = _db.scalar(conn.execute(self.q["job_purge_cutoff"], {"older": older_than}))
            params = {"state": state, "cutoff": cutoff, "limit": BATCH, "cap": 1_000_000}
            if dry_run:
                n = _db.count(conn.execute(self.q["job_purge_count"], params))
                return Purged(state, cutoff, n, capped=n >= params["cap"])
            total = batches = 0
            while deleted := conn.execute(self.q["job_purge_batch"], params).rowcount:
                total += deleted
                batches += 1
                if max_batches is not None and batches >= max_batches:
                    return Purged(state, cutoff, total, batches, more=True)
        return Purged(state, cutoff, total, batches)

    def job_running_list(self) -> list[RunningJobRow]:
        with self.connector.conn("reading running jobs failed") as conn:
            running = _db.rows(conn.execute(self.q["job_running_list"]), dict)
        return [RunningJobRow(**{**r, "progress": Progress.of(r["progress"])}) for r in running]

    def job_dead_recent(self, limit: int) -> list[DeadJob]:
        with self.connector.conn("reading dead jobs failed") as conn:
            return _db.rows(conn.execute(self.q["job_dead_recent"], {"limit": limit}), DeadJob)

    def job_finished_per_minute(self, minutes: int) -> list[FinishedMinute]:
        """Jobs that succeeded and that went dead in each of the last `minutes` minutes
        (the current one last, partial), every minute present (0 when none finished)."""
        with self.connector.conn("reading finished jobs failed") as conn:
            cursor = conn.execute(self.q["job_finished_per_minute"], {"minutes": minutes})
            return _db.rows(cursor, FinishedMinute)


def _batches(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), BATCH):
        yield ids[start : start + BATCH]
