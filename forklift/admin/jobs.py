"""The operator's job store: the only caller of admin/jobs.sql (list, show, retry, purge,
and what `forklift top` reads of jobs; a cancel is the batch store's, which a batch's
cancel runs too), over short bounded connections (or a Connector's session)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from forklift import _db, _sql
from forklift._bounds import BATCH, LIST_WINDOW
from forklift._ids import operator
from forklift.admin._connect import Connector
from forklift.admin.rows import (
    Acted,
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
            jobs = [JobRow(*r) for r in conn.execute(self.q["job_list"], params)]
            if len(jobs) > limit:
                return JobPage(jobs[:limit], jobs[limit - 1].id)
            row = conn.execute(self.q["job_list_window"], params).fetchone()
        assert row is not None
        scanned, oldest = row
        # Short, and the window was full: older jobs may match too.
        return JobPage(jobs, int(oldest) if scanned == window else None)

    def job_get(self, job_id: int) -> JobDetail:
        """Everything about one job; JobNotFound if there is none."""
        with self.connector.conn("reading the job failed") as conn:
            r = conn.execute(self.q["job_get"], {"id": job_id}).fetchone()
        if r is None:
            raise JobNotFound(f"no job {job_id} in schema {self.schema}")
        args, key, timeout, lease_until, errors, now, result, progress, batch_id, limit_key = r[
            16:26
        ]
        return JobDetail(
            JobRow(*r[:16]), args, key, timeout, lease_until, errors, now, result,
            Progress.of(progress), batch_id, limit_key, ran_by=r[26],
        )  # fmt: skip

    def job_retry_many(self, ids: Sequence[int], by: str | None = None) -> list[Acted]:
        """Dead or cancelled jobs back to ready now, attempts and crashes reset to 0, the
        retry noted in their error history as by `by` (default: this user@host).

        One Acted per id asked for, in id order: done, or why not (its state; None if
        there is no such job).
        """
        found: dict[int, Acted] = {}
        with self.connector.conn("retrying jobs failed") as conn:
            for batch in _batches(sorted(set(ids))):
                params = {"ids": batch, "by": by or operator()}
                for id_, was, attempts, crashes, done in conn.execute(
                    self.q["job_retry_many"], params
                ):
                    found[id_] = Acted(id_, done, was, attempts, crashes)
        return [found.get(i, Acted(i, False, None)) for i in sorted(set(ids))]

    def job_dead_ids(self, queue: str | None, task: str | None) -> Iterator[list[int]]:
        """Every dead job's id (of a queue, of a task), a batch at a time, in id order."""
        after = 0
        while True:
            params = {"after": after, "queue": queue, "task": task, "limit": BATCH}
            with self.connector.conn("finding dead jobs failed") as conn:
                batch = [r[0] for r in conn.execute(self.q["job_dead_ids"], params)]
            if not batch:
                return
            yield batch
            after = batch[-1]

    def job_cancel_many(self, ids: Sequence[int], by: str | None = None) -> list[Acted]:
        """Cancel ready and running jobs now; a running job's worker is told to stop. The
        error history says by whom: `by` (default: this user@host).

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
            row = conn.execute(self.q["job_purge_cutoff"], {"older": older_than}).fetchone()
            assert row is not None
            params = {"state": state, "cutoff": row[0], "limit": BATCH, "cap": 1_000_000}
            if dry_run:
                counted = conn.execute(self.q["job_purge_count"], params).fetchone()
                n = int(counted[0]) if counted else 0
                return Purged(state, row[0], n, capped=n >= params["cap"])
            total = batches = 0
            while deleted := conn.execute(self.q["job_purge_batch"], params).rowcount:
                total += deleted
                batches += 1
                if max_batches is not None and batches >= max_batches:
                    return Purged(state, row[0], total, batches, more=True)
        return Purged(state, row[0], total, batches)

    def job_running_list(self) -> list[RunningJobRow]:
        with self.connector.conn("reading running jobs failed") as conn:
            rows = conn.execute(self.q["job_running_list"]).fetchall()
        return [
            RunningJobRow(id_, queue, task, owner, attempt, took, Progress.of(progress))
            for id_, queue, task, owner, attempt, took, progress in rows
        ]

    def job_dead_recent(self, limit: int) -> list[DeadJob]:
        with self.connector.conn("reading dead jobs failed") as conn:
            return [DeadJob(*r) for r in conn.execute(self.q["job_dead_recent"], {"limit": limit})]

    def job_finished_per_minute(self, minutes: int) -> list[FinishedMinute]:
        """Jobs that succeeded and that went dead in each of the last `minutes` minutes
        (the current one last, partial), every minute present (0 when none finished)."""
        with self.connector.conn("reading finished jobs failed") as conn:
            rows = conn.execute(self.q["job_finished_per_minute"], {"minutes": minutes})
            return [FinishedMinute(*r) for r in rows]


def _batches(ids: list[int]) -> Iterator[list[int]]:
    for start in range(0, len(ids), BATCH):
        yield ids[start : start + BATCH]
