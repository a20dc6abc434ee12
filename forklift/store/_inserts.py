"""The enqueue statements, written once as steps (_steps.py) that the job store drives
on a sync connection or a caller's AsyncConnection."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any, TypeVar

from forklift.store._rows import NewJob
from forklift.store._steps import Copy, Query, Steps
from forklift.store.producing import ProducerLimits

_T = TypeVar("_T")

# The NewJob fields its row takes as they are, in the order of the `_job_columns` fragment
# (fragments.sql): job_copy's rows, and the columns every insert of a job selects.
COLUMNS = (
    "queue", "task", "args", "priority", "max_attempts", "max_crashes", "timeout", "batch_id",
    "limit_key", "trace_context",
)  # fmt: skip
# An insert's parameters (the `_job_arrays` and `_job_values` fragments): the columns,
# then the key and when the job is due (run_at, else now, plus delay: the database's clock).
FIELDS = (*COLUMNS, "idempotency_key", "run_at", "delay")
column_values = attrgetter(*COLUMNS)  # a job's values of COLUMNS, as a tuple


def params(jobs: Sequence[NewJob]) -> dict[str, list[Any]]:
    """`jobs` as an insert's parameters: one array per field (FIELDS, `_job_arrays`)."""
    return {name: [getattr(job, name) for job in jobs] for name in FIELDS}


def values(job: NewJob) -> dict[str, Any]:
    """`job` as the parameters of an insert of it alone (FIELDS, `_job_values`)."""
    return {name: getattr(job, name) for name in FIELDS}


def stored(job: NewJob) -> dict[str, Any]:
    """`job`'s columns as a JSON object, kept until it is inserted from it (a batch's
    callback, by batch_finish); its key and due time are the inserting statement's."""
    row = dict(zip(COLUMNS, column_values(job), strict=True))
    row["args"] = json.loads(job.args)
    if job.trace_context is not None:
        row["trace_context"] = json.loads(job.trace_context)
    return row


class Inserts:
    """One job's insert, and a bulk insert in chunks of `chunk` rows, as steps."""

    def __init__(self, q: dict[str, str], producing: ProducerLimits, chunk: int) -> None:
        self.q = q
        self.producing = producing
        self.chunk = chunk

    def one(self, job: NewJob, *, quiet: bool = False) -> Steps[int]:
        """Insert `job`; `quiet`: without notifying in its transaction (an autocommit
        connection of forklift's own, whose caller wakes the queue after the commit)."""
        yield from self.producing.prepare([job])  # with the limit's key found
        rows = yield Query(self.q["job_insert_quiet" if quiet else "job_insert"], values(job))
        if rows:
            ((job_id,),) = rows  # one row of one column: the new job's id
            return int(job_id)
        # The key is taken: by a committed job (found now) or by one whose insert we
        # waited on; a fresh statement sees it either way.
        assert job.idempotency_key is not None
        return (yield from self.ids_by_key([job.idempotency_key]))[job.idempotency_key]

    def ids_by_key(self, keys: Sequence[str]) -> Steps[dict[str, int]]:
        rows = yield Query(self.q["job_ids_by_key"], {"keys": list(keys)})
        return {key: int(id_) for id_, key in rows}

    def many(
        self,
        jobs: Iterable[NewJob],
        count: int,
        *,
        quiet: bool = False,
        queues: set[str] | None = None,
    ) -> Steps[list[int]]:
        """Insert the `count` `jobs` in the caller's transaction; their ids, in order.
        `quiet`: without notifying in it (forklift's own transaction, whose caller wakes
        the queues after the commit, noted in `queues` as the jobs go in).

        `jobs` may validate each job as it is taken (App.enqueue_many): the plain ones (no
        idempotency key, due now) go into COPY rows as they come, so PostgreSQL inserts
        while Python validates the next; a job refused there aborts the COPY, and the
        caller's rollback leaves none of them. Under a queue's max_depth every job is
        validated and counted first."""
        if quiet:
            yield Query(self.q["quiet"])
        yield from self.producing.refresh()
        if self.producing.depth_limited:
            jobs = list(jobs)
            yield from self.producing.check_depth(jobs)
        ids: list[int | None] = [None] * count
        other: list[tuple[int, NewJob]] = []  # keyed or delayed: INSERTed after the COPY
        plain = self._plain(jobs, count, other, set() if queues is None else queues)
        while (first := next(plain, None)) is not None:
            # Ids for the rest of this statement, reserved up front so that every id is
            # known without relying on the order of RETURNING: at most a chunk, and no
            # more than jobs are left (some may turn out keyed: their ids go unused).
            n = min(self.chunk, count - first[0])
            reserved = yield Query(self.q["job_ids_reserve"], {"n": n})
            yield Copy(self.q["job_copy"], self._rows(first, plain, reserved, ids))
        unkeyed = [i for i, j in other if j.idempotency_key is None]  # delayed ones
        for places in self._chunks(unkeyed):
            reserved = yield Query(self.q["job_ids_reserve"], {"n": len(places)})
            for i, (new_id,) in zip(places, reserved, strict=True):
                ids[i] = int(new_id)
        by_key: dict[str, int] = {}
        for part in self._chunks(other):
            keyed = yield from self._insert_rows([j for _, j in part], [ids[i] for i, _ in part])
            by_key.update(keyed)
        # Keys taken already (by a committed job, an earlier chunk, or twice in one chunk).
        missing = sorted({k for _, j in other if (k := j.idempotency_key) and k not in by_key})
        for keys in self._chunks(missing):
            by_key.update((yield from self.ids_by_key(keys)))
        for i, job in other:
            if job.idempotency_key is not None:
                ids[i] = by_key[job.idempotency_key]
        if None in ids:
            raise AssertionError(f"bulk insert: fewer than the {count} jobs announced")
        return [int(i) for i in ids]  # type: ignore[arg-type]

    def _plain(
        self,
        jobs: Iterable[NewJob],
        count: int,
        other: list[tuple[int, NewJob]],
        queues: set[str],
    ) -> Iterator[tuple[int, NewJob]]:
        """The plain jobs of `jobs` with their places, keyed by their limits, their queues
        noted; the others (keyed or delayed, for an INSERT) go to `other` as they pass."""
        producing = self.producing
        for i, job in enumerate(jobs):
            if i >= count:
                raise AssertionError(f"bulk insert: more than the {count} jobs announced")
            producing.key(job)
            queues.add(job.queue)
            if job.idempotency_key is None and job.due_now:
                yield i, job
            else:
                other.append((i, job))

    @staticmethod
    def _rows(
        first: tuple[int, NewJob],
        plain: Iterator[tuple[int, NewJob]],
        reserved: Sequence[Sequence[Any]],
        ids: list[int | None],
    ) -> Iterator[tuple[Any, ...]]:
        """job_copy's rows: `first`, then the plain jobs after it, one for each reserved
        id and no more (the rest go in the next statement); their ids noted."""
        taken: tuple[int, NewJob] | None = first
        for (new_id,) in reserved:
            if taken is None and (taken := next(plain, None)) is None:
                return
            i, j = taken
            taken = None
            ids[i] = new_id = int(new_id)
            yield (new_id, *column_values(j))

    def _insert_rows(
        self, jobs: Sequence[NewJob], ids: Sequence[int | None]
    ) -> Steps[dict[str, int]]:
        """One INSERT of keyed or delayed jobs; the ids of the keys it inserted."""
        rows = yield Query(self.q["job_insert_many"], {"id": list(ids), **params(jobs)})
        return {key: int(id_) for id_, key in rows if key is not None}

    def _chunks(self, items: Sequence[_T]) -> Iterator[Sequence[_T]]:
        for start in range(0, len(items), self.chunk):
            yield items[start : start + self.chunk]
