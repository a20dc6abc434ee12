"""The enqueue statements, written once as steps (_steps.py) that the job store drives
on a sync connection or a caller's AsyncConnection."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

from forklift.store._rows import NewJob
from forklift.store._steps import Copy, Query, Steps
from forklift.store.producing import ProducerLimits

_T = TypeVar("_T")

# The NewJob fields an insert takes, as its parameters are named.
JOB_COLUMNS = (
    "queue", "task", "args", "idempotency_key", "priority", "max_attempts", "max_crashes",
    "timeout", "run_at", "delay", "batch_id", "limit_key", "trace_context",
)  # fmt: skip


class Inserts:
    """One job's insert, and a bulk insert in chunks of `chunk` rows, as steps."""

    def __init__(self, q: dict[str, str], producing: ProducerLimits, chunk: int) -> None:
        self.q = q
        self.producing = producing
        self.chunk = chunk

    def one(self, job: NewJob, *, quiet: bool = False) -> Steps[int]:
        """Insert `job`; `quiet`: without notifying in its transaction (an autocommit
        connection of forklift's own, whose caller wakes the queue after the commit)."""
        yield from self.producing.prepare([job])
        params = {name: getattr(job, name) for name in JOB_COLUMNS}  # with the key found
        rows = yield Query(self.q["job_insert_quiet" if quiet else "job_insert"], params)
        if rows:
            return int(rows[0][0])
        # The key is taken: by a committed job (found now) or by one whose insert we
        # waited on; a fresh statement sees it either way.
        assert job.idempotency_key is not None
        return (yield from self.ids_by_key([job.idempotency_key]))[job.idempotency_key]

    def ids_by_key(self, keys: Sequence[str]) -> Steps[dict[str, int]]:
        rows = yield Query(self.q["job_ids_by_key"], {"keys": list(keys)})
        return {key: int(id_) for id_, key in rows}

    def many(self, jobs: Sequence[NewJob], *, quiet: bool = False) -> Steps[list[int]]:
        """Insert `jobs` in the caller's transaction; `quiet`: without notifying in it
        (forklift's own transaction, whose caller wakes the queues after the commit)."""
        if quiet:
            yield Query(self.q["quiet"])
        yield from self.producing.prepare(jobs)
        # Unkeyed jobs get reserved ids up front, so every id is known without relying on
        # the order of RETURNING; keyed jobs are looked up by key.
        ids: list[int | None] = [None] * len(jobs)
        unkeyed = [i for i, j in enumerate(jobs) if j.idempotency_key is None]
        for part in self._chunks(unkeyed):
            reserved = yield Query(self.q["job_ids_reserve"], {"n": len(part)})
            for i, (new_id,) in zip(part, reserved, strict=True):
                ids[i] = int(new_id)
        for part in self._chunks([i for i in unkeyed if jobs[i].due_now]):
            rows = [
                (ids[i], j.queue, j.task, j.args, j.priority, j.max_attempts, j.max_crashes,
                 j.timeout, j.batch_id, j.limit_key, j.trace_context)
                for i in part
                for j in (jobs[i],)
            ]  # fmt: skip
            yield Copy(self.q["job_copy"], rows)
        other = [i for i, j in enumerate(jobs) if not (j.idempotency_key is None and j.due_now)]
        by_key: dict[str, int] = {}
        for part in self._chunks(other):
            by_key.update(
                (yield from self._insert_rows([jobs[i] for i in part], [ids[i] for i in part]))
            )
        # Keys taken already (by a committed job, an earlier chunk, or twice in one chunk).
        missing = sorted({k for i in other if (k := jobs[i].idempotency_key) and k not in by_key})
        for keys in self._chunks(missing):
            by_key.update((yield from self.ids_by_key(keys)))
        for i in other:
            key = jobs[i].idempotency_key
            if key is not None:
                ids[i] = by_key[key]
        assert all(i is not None for i in ids)
        return [int(i) for i in ids]  # type: ignore[arg-type]

    def _insert_rows(
        self, jobs: Sequence[NewJob], ids: Sequence[int | None]
    ) -> Steps[dict[str, int]]:
        """One INSERT of keyed or delayed jobs; the ids of the keys it inserted."""
        cols: dict[str, list[Any]] = {"id": list(ids)}
        for k in JOB_COLUMNS:
            cols[k] = [getattr(j, k) for j in jobs]
        rows = yield Query(self.q["job_insert_many"], cols)
        return {key: int(id_) for id_, key in rows if key is not None}

    def _chunks(self, items: Sequence[_T]) -> Iterator[Sequence[_T]]:
        for start in range(0, len(items), self.chunk):
            yield items[start : start + self.chunk]
