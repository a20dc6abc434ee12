"""The batch store: the only caller of the batch queries (store/batches.sql).

A batch is a row in `batches` and the jobs whose `batch_id` names it. It finishes once:
the transaction that sets its `finished_at` also enqueues its callback, under the row's
lock, after seeing none of its jobs open.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from forklift import _db, _sql
from forklift.store._boundary import Conn, translated

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


class BatchStore:
    """Runs the batch queries on connections from `connect` (a pool's `connection`, or a
    one-shot command's), or on a caller's connection where stated."""

    def __init__(self, connect: Callable[[], AbstractContextManager[Conn]], schema: str) -> None:
        self.connect = connect
        self.schema = schema
        self.q = _sql.load("forklift.store", "batches.sql", schema)

    @contextmanager
    def _conn(self, what: str, conn: Conn | None = None) -> Iterator[Conn]:
        with translated(what):
            if conn is not None:
                yield conn
            else:
                with self.connect() as own:
                    yield own

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
            row = conn.execute(self.q["batch_finish"], {"id": batch_id}).fetchone()
        if row is None:
            return None
        outcome, callback, _, delay = row
        return Finished(outcome, callback, max(0.0, float(delay or 0.0)))

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
            row = c.execute(self.q["batch_get"], {"id": batch_id}).fetchone()
        return None if row is None else BatchRow(*row)

    def counts(self, batch_id: int, conn: Conn | None = None) -> BatchCounts:
        with self._conn("counting the batch's jobs failed", conn) as c:
            rows = c.execute(self.q["batch_counts"], {"id": batch_id}).fetchall()
        ended = [r[4] for r in rows if r[4] is not None]
        return BatchCounts(
            {r[0]: int(r[1]) for r in rows},
            sum(float(r[2]) for r in rows),
            sum(float(r[3]) for r in rows),
            max(ended) if ended else None,
        )

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
        """Every row, by its column names (the `first` ones, if given), a page of PAGE at
        a time."""
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
            row = _db.one(c.execute(self.q["job_outcome"], {"id": job_id}), dict)
        if row is None:
            return None
        result = None if row["result"] is None else json.loads(row["result"])
        return row["state"], result, row["last_error"]

    def job_wait_mark(self, job_id: int, conn: Conn | None = None) -> None:
        with self._conn("marking the job waited for failed", conn) as c:
            c.execute(self.q["job_wait_mark"], {"id": job_id})

    def done_listen(self, conn: Conn) -> None:
        with translated("listening for ends failed"):
            conn.execute(self.q["done_listen"])

    # -- acting ------------------------------------------------------------------------

    def cancel(self, batch_id: int, by: str) -> bool:
        """Mark the batch cancelled, and sealed if it was filling; False when it was
        cancelled already, or finished."""
        with self._conn("cancelling the batch failed") as conn:
            params = {"id": batch_id, "by": by}
            return conn.execute(self.q["batch_cancel"], params).fetchone() is not None
