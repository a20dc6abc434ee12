"""The batch store: the only caller of the batch queries (store/batches.sql), and of the
job queries that waiting for a result and cancelling a batch need.

A batch is a row in `batches` and the jobs whose `batch_id` names it. It finishes once:
the transaction that sets its `finished_at` also enqueues its callback, under the row's
lock, after seeing none of its jobs open.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from forklift import _db, _sql
from forklift._bounds import BATCH
from forklift.store._boundary import Conn, connected, translated

PAGE = 5_000  # rows per statement when reading a batch's jobs


class Finished(NamedTuple):
    """What finishing a batch did: its outcome, its callback's job (None: it has none),
    and the seconds from its last job's end to now (when the callback went in)."""

    outcome: str
    callback_job_id: int | None
    delay: float


@dataclass(frozen=True, slots=True)
class BatchRow:
    """A batch as stored, with the database's clock (`now`) when it was read."""

    id: int
    total: int
    callback_task: str | None
    callback_job_id: int | None
    outcome: str | None
    created_at: datetime
    sealed_at: datetime | None
    cancelled_at: datetime | None
    cancelled_by: str | None
    finished_at: datetime | None
    now: datetime
    callback_state: str | None
    abandoned_at: datetime | None = None  # sealed by maintenance: its producer left it


@dataclass(frozen=True, slots=True)
class BatchCounts:
    """A batch's jobs by state, the progress its running jobs report (summed), and when
    its latest job ended."""

    by_state: dict[str, int]
    progress_done: float
    progress_total: float
    last_ended: datetime | None


@dataclass(frozen=True, slots=True)
class CancelledJob:
    """A job asked to be cancelled: its state (`was`) and owner before, whether it was
    cancelled (`done`: only blocked, ready and running jobs are), and its batch."""

    id: int
    was: str
    owner: str | None
    done: bool
    batch_id: int | None


class BatchStore:
    """Runs the batch queries on connections from `connect` (a pool's `connection`, or a
    one-shot command's), or on a caller's connection where stated."""

    def __init__(self, connect: Callable[[], AbstractContextManager[Conn]], schema: str) -> None:
        self.connect = connect
        self.schema = schema
        self.q = _sql.load("forklift.store", "batches.sql", schema)

    def _conn(self, what: str, conn: Conn | None = None) -> AbstractContextManager[Conn]:
        return connected(self.connect, what, conn)

    # -- making ------------------------------------------------------------------------

    def create(
        self, callback: dict[str, Any] | None, total: int, *, sealed: bool, conn: Conn
    ) -> int:
        params = {
            "callback": None if callback is None else json.dumps(callback),
            "total": total,
            "sealed": sealed,
        }
        with translated("creating the batch failed"):
            batch_id = _db.scalar(conn.execute(self.q["batch_create"], params))
        assert batch_id is not None
        return int(batch_id)

    def add(self, batch_id: int, n: int, conn: Conn) -> bool:
        """Count `n` jobs added; False when the batch is sealed, cancelled (or gone)."""
        with translated("adding to the batch failed"):
            row = conn.execute(self.q["batch_add"], {"id": batch_id, "n": n}).fetchone()
        return row is not None

    def seal(self, batch_id: int) -> None:
        with self._conn("sealing the batch failed") as conn:
            conn.execute(self.q["batch_seal"], {"id": batch_id})

    # -- finishing ---------------------------------------------------------------------

    def done_among(self, batch_ids: list[int]) -> list[int]:
        """Which of these batches look finished (sealed, none of their jobs open)."""
        with self._conn("checking batches failed") as conn:
            return _db.scalars(conn.execute(self.q["batch_done_among"], {"ids": batch_ids}))

    def finish(self, batch_id: int) -> Finished | None:
        """Finish the batch if it is sealed and none of its jobs is open, enqueueing its
        callback; None when it is not (yet) or another finisher was first."""
        with self._conn("finishing the batch failed") as conn, conn.transaction():
            if conn.execute(self.q["batch_lock_open"], {"id": batch_id}).fetchone() is None:
                return None  # finished already, or not sealed
            row = _db.one(conn.execute(self.q["batch_finish"], {"id": batch_id}), dict)
        if row is None:
            return None
        delay = max(0.0, float(row["delay"] or 0.0))
        return Finished(row["outcome"], row["callback_job_id"], delay)

    def finish_if_done(self, batch_ids: set[int]) -> dict[int, Finished]:
        """After jobs of these batches ended (committed): finish those that are done.
        One probe for all; the lock and the finish only for a batch that looks done."""
        if not batch_ids:
            return {}
        finished = {}
        for batch_id in self.done_among(sorted(batch_ids)):
            if (done := self.finish(batch_id)) is not None:
                finished[batch_id] = done
        return finished

    def abandon(self, after: float, limit: int) -> list[int]:
        """Seal, as abandoned, up to `limit` batches still filling `after` seconds after
        their last enqueue; their ids."""
        params = {"after": after, "limit": limit}
        with self._conn("abandoning batches failed") as conn:
            return _db.scalars(conn.execute(self.q["batch_abandon"], params))

    def sweep_ids(self, after: int, limit: int) -> list[int]:
        """Sealed batches not finished, in id order after `after`."""
        params = {"after": after, "limit": limit}
        with self._conn("reading open batches failed") as conn:
            return _db.scalars(conn.execute(self.q["batch_sweep"], params))

    def prune(self, keep: float, limit: int = 2000) -> int:
        with self._conn("pruning batches failed") as conn:
            return conn.execute(self.q["batch_prune"], {"keep": keep, "limit": limit}).rowcount

    # -- reading -----------------------------------------------------------------------

    def get(self, batch_id: int, conn: Conn | None = None) -> BatchRow | None:
        with self._conn("reading the batch failed", conn) as c:
            return _db.one(c.execute(self.q["batch_get"], {"id": batch_id}), BatchRow)

    def list_open(self, limit: int) -> list[BatchRow]:
        """Up to `limit` batches not finished, newest first."""
        with self._conn("listing batches failed") as conn:
            return _db.rows(conn.execute(self.q["batch_list_open"], {"limit": limit}), BatchRow)

    def list_finished(self, limit: int) -> list[BatchRow]:
        """Up to `limit` finished batches, the latest to finish first."""
        with self._conn("listing batches failed") as conn:
            query = self.q["batch_list_finished"]
            return _db.rows(conn.execute(query, {"limit": limit}), BatchRow)

    def callback(self, batch_id: int) -> str | None:
        """The batch's callback as its row keeps it (JSON text); None: it has none."""
        with self._conn("reading the batch failed") as conn:
            found: str | None = _db.scalar(conn.execute(self.q["batch_callback"], {"id": batch_id}))
            return found

    def counts(self, batch_id: int, conn: Conn | None = None) -> BatchCounts:
        with self._conn("counting the batch's jobs failed", conn) as c:
            rows = _db.rows(c.execute(self.q["batch_counts"], {"id": batch_id}), dict)
        ended = [r["last_ended"] for r in rows if r["last_ended"] is not None]
        return BatchCounts(
            {r["state"]: int(r["n"]) for r in rows},
            sum(float(r["done"]) for r in rows),
            sum(float(r["total"]) for r in rows),
            max(ended) if ended else None,
        )

    def tally_many(self, rows: list[BatchRow]) -> dict[int, BatchCounts]:
        """These batches' jobs by state, in one statement, at a cost that does not grow
        with the jobs that succeeded (the dashboard counts its batches every second):
        ready, running, dead and cancelled counted through their indexes, succeeded what
        the total leaves (jobs pruned since count as succeeded); no `last_ended`."""
        found: dict[int, dict[str, int]] = {r.id: {} for r in rows}
        progress = dict.fromkeys(found, (0.0, 0.0))
        if rows:
            with self._conn("counting the batches' jobs failed") as conn:
                cursor = conn.execute(self.q["batch_tally_many"], {"ids": list(found)})
                for t in _db.rows(cursor, dict):
                    if t["n"]:
                        found[t["id"]][t["state"]] = int(t["n"])
                    if t["state"] == "running":
                        progress[t["id"]] = (float(t["done"]), float(t["total"]))
        tallies = {}
        for row in rows:
            by_state = found[row.id]
            by_state["succeeded"] = max(0, row.total - sum(by_state.values()))
            tallies[row.id] = BatchCounts(by_state, *progress[row.id], None)
        return tallies

    def job_ids(self, batch_id: int) -> list[int]:
        return [r["id"] for r in self._pages("batch_job_ids", batch_id)]

    def results(self, batch_id: int) -> dict[int, Any]:
        """The succeeded jobs' results, in job order (None: the handler returned none)."""
        return {
            r["id"]: None if r["result"] is None else json.loads(r["result"])
            for r in self._pages("batch_results", batch_id)
        }

    def dead(self, batch_id: int, first: int | None = None) -> dict[int, str | None]:
        """The dead jobs' last errors, in job order (only the `first` ones, if given)."""
        return {r["id"]: r["last_error"] for r in self._pages("batch_dead", batch_id, first)}

    def open_job_ids(self, batch_id: int) -> list[int]:
        return [r["id"] for r in self._pages("batch_open_jobs", batch_id)]

    def _pages(
        self, query: str, batch_id: int, first: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """Every row (the `first` ones, if given), a page of PAGE at a time, in job id
        order."""
        after, page = 0, PAGE if first is None else min(first, PAGE)
        while True:
            params = {"id": batch_id, "after": after, "limit": page}
            with self._conn("reading the batch's jobs failed") as conn:
                rows = _db.rows(conn.execute(self.q[query], params), dict)
            yield from rows
            if len(rows) < page or first is not None:
                return
            after = rows[-1]["id"]

    def job_outcome(
        self, job_id: int, conn: Conn | None = None
    ) -> tuple[str, Any, str | None] | None:
        """A job's state, result (decoded) and last error; None if there is no such job."""
        with self._conn("reading the job failed", conn) as c:
            found = _db.one(c.execute(self.q["job_outcome"], {"id": job_id}), dict)
        if found is None:
            return None
        result = None if found["result"] is None else json.loads(found["result"])
        return found["state"], result, found["last_error"]

    def job_wait_mark(self, job_id: int, conn: Conn | None = None) -> None:
        with self._conn("marking the job waited for failed", conn) as c:
            c.execute(self.q["job_wait_mark"], {"id": job_id})

    def done_listen(self, conn: Conn) -> None:
        with translated("listening for ends failed"):
            conn.execute(self.q["done_listen"])

    # -- acting ------------------------------------------------------------------------

    def cancel(self, batch_id: int, by: str, why: str = "") -> tuple[bool, list[CancelledJob]]:
        """Mark the batch cancelled (by `by`, for `why`), and sealed if it was filling;
        cancel its ready and running jobs (a running one as `forklift jobs cancel` does:
        its worker is told to stop); finish it if none of its jobs is left open. Whether
        this call marked it (False: cancelled already, or finished) and its jobs asked to
        cancel. A finished batch (or none) is left as it is."""
        row = self.get(batch_id)
        if row is None or row.finished_at is not None:
            return False, []
        with self._conn("cancelling the batch failed") as conn:
            params = {"id": batch_id, "by": f"{by} ({why})" if why else by}
            marked = conn.execute(self.q["batch_cancel"], params).fetchone() is not None
        jobs = self.job_cancel_many(self.open_job_ids(batch_id), by)
        # Its jobs' cancel finished it if they were its last open ones; this finishes one
        # that had none open (its end not yet seen by a worker's sweep).
        self.finish_if_done({batch_id})
        return marked, jobs

    def job_cancel_many(self, ids: Sequence[int], by: str) -> list[CancelledJob]:
        """Cancel ready and running jobs now, BATCH at a statement; a running job's worker
        is told to stop. The error history says by whom: `by`. Then the batches whose
        last open jobs these were finish. Every job found, in id order."""
        found: list[CancelledJob] = []
        asked = sorted(set(ids))
        with self._conn("cancelling jobs failed") as conn:
            for start in range(0, len(asked), BATCH):
                params = {"ids": asked[start : start + BATCH], "by": by}
                found += _db.rows(conn.execute(self.q["job_cancel_many"], params), CancelledJob)
        # After the commit: a batch whose last open jobs these were finishes now.
        self.finish_if_done({j.batch_id for j in found if j.done and j.batch_id is not None})
        return found
