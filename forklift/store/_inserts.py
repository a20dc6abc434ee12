"""The enqueue statements, written once as steps (_steps.py) that the job store drives
on a sync connection or a caller's AsyncConnection."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime, timedelta
from operator import attrgetter
from typing import Any, TypeVar

from forklift.errors import DatabaseError, UniqueConflict
from forklift.store._rows import NewJob
from forklift.store._steps import Copy, Query, Steps
from forklift.store.producing import ProducerLimits

_T = TypeVar("_T")

# The NewJob fields its row takes as they are, in the order of the `_job_columns` fragment
# (fragments.sql): job_copy's rows, and the columns every insert of a job selects.
COLUMNS = (
    "queue", "task", "args", "priority", "max_attempts", "max_crashes", "timeout", "batch_id",
    "limit_key", "trace_context", "fair_key", "fair_weight", "requires",
)  # fmt: skip
# An insert's parameters (the `_job_arrays` and `_job_values` fragments): the columns,
# then the key and when the job is due (run_at, else now, plus delay: the database's clock).
FIELDS = (*COLUMNS, "idempotency_key", "run_at", "delay")
# A unique insert's (forklift/unique.py), after FIELDS: `_unique_arrays`, `_unique_values`.
UNIQUE_FIELDS = (*FIELDS, "unique_key", "unique_period", "unique_states")
column_values = attrgetter(*COLUMNS)  # a job's values of COLUMNS, as a tuple
# Rounds of a unique insert: each inserts the job or finds the job holding its key, unless
# that one left its states between the two statements (rare); then the insert is tried again.
UNIQUE_ROUNDS = 5
# A bulk enqueue of at least this many unique jobs tries them by COPY first
# (UniqueInserts._copied): below it, the two statements more cost what COPY saves.
COPY_AT_LEAST = 50


def params(jobs: Sequence[NewJob], fields: Sequence[str] = FIELDS) -> dict[str, list[Any]]:
    """`jobs` as an insert's parameters: one array per field (FIELDS, `_job_arrays`)."""
    return {name: [getattr(job, name) for job in jobs] for name in fields}


def values(job: NewJob, fields: Sequence[str] = FIELDS) -> dict[str, Any]:
    """`job` as the parameters of an insert of it alone (FIELDS, `_job_values`)."""
    return {name: getattr(job, name) for name in fields}


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
        self.unique = UniqueInserts(q, chunk, self.ids_by_key)

    def one(self, job: NewJob, *, quiet: bool = False) -> Steps[int]:
        """Insert `job`; `quiet`: without notifying in its transaction (an autocommit
        connection of forklift's own, whose caller wakes the queue after the commit)."""
        yield from self.producing.prepare([job])  # with the limit's key found
        if job.unique_key is not None:
            return (yield from self.unique.one(job, quiet=quiet))
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
        idempotency key, not unique, due now) go into COPY rows as they come, so
        PostgreSQL inserts while Python validates the next; a job refused there aborts
        the COPY, and the caller's rollback leaves none of them. Under a queue's max_depth
        every job is validated and counted first."""
        if quiet:
            yield Query(self.q["quiet"])
        yield from self.producing.refresh()
        if self.producing.depth_limited:
            jobs = list(jobs)
            yield from self.producing.check_depth(jobs)
        ids: list[int | None] = [None] * count
        other: list[tuple[int, NewJob]] = []  # keyed, delayed or unique: after the COPY
        plain = self._plain(jobs, count, other, set() if queues is None else queues)
        while (first := next(plain, None)) is not None:
            # Ids for the rest of this statement, reserved up front so that every id is
            # known without relying on the order of RETURNING: at most a chunk, and no
            # more than jobs are left (some may turn out keyed: their ids go unused).
            n = min(self.chunk, count - first[0])
            reserved = yield Query(self.q["job_ids_reserve"], {"n": n})
            yield Copy(self.q["job_copy"], self._rows(first, plain, reserved, ids))
        unique = [(i, j) for i, j in other if j.unique_key is not None]
        other = [(i, j) for i, j in other if j.unique_key is None]
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
        if unique:  # after the others: one of them may hold a unique job's idempotency key
            yield from self.unique.many(unique, ids)
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
        noted; the others (keyed, delayed or unique, for an INSERT) go to `other` as they pass."""
        producing = self.producing
        for i, job in enumerate(jobs):
            if i >= count:
                raise AssertionError(f"bulk insert: more than the {count} jobs announced")
            producing.key(job)
            queues.add(job.queue)
            if job.idempotency_key is None and job.due_now and job.unique_key is None:
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


class UniqueInserts:
    """The inserts of unique jobs (forklift/unique.py), one or many, as steps: each job
    is inserted, or replaces the ready job holding its key (on_conflict="replace"), or
    finds the job holding its key (or its idempotency key) and returns its id, or raises
    UniqueConflict with it (on_conflict="raise")."""

    def __init__(
        self,
        q: dict[str, str],
        chunk: int,
        ids_by_key: Callable[[Sequence[str]], Steps[dict[str, int]]],
    ) -> None:
        self.q = q
        self.chunk = chunk
        self.ids_by_key = ids_by_key

    def one(self, job: NewJob, *, quiet: bool = False) -> Steps[int]:
        """Insert unique `job` (`quiet`: as Inserts.one's); its id, or its holder's."""
        statement = self.q[
            "job_insert_replace" if job.on_conflict == "replace" else "job_insert_unique"
        ]
        given = {**values(job, UNIQUE_FIELDS), "quiet": quiet}
        for _ in range(UNIQUE_ROUNDS):
            rows = yield Query(statement, given)
            if rows:
                return int(rows[0][0])
            found = yield from self._holders([job])
            if job.unique_key in found:
                return found[job.unique_key]
        raise _unsettled(job)

    def many(self, placed: Sequence[tuple[int, NewJob]], ids: list[int | None]) -> Steps[None]:
        """Insert the unique jobs `placed` (their places in the call) and note their ids
        in `ids`. Jobs of one key in the same call are one job: each is given its id. It
        is inserted with the first one's values, or the last replacing one's."""
        places: dict[str, list[int]] = {}
        chosen: dict[str, NewJob] = {}
        for i, job in placed:
            key = str(job.unique_key)
            places.setdefault(key, []).append(i)
            if key not in chosen or job.on_conflict == "replace":
                chosen[key] = job
        # In key order, whatever the call's: two bulk enqueues that wait on each other's
        # keys (a row to replace, an insert not yet committed) then wait in one order, not
        # in a cycle (a deadlock).
        pending = sorted(chosen.values(), key=lambda job: str(job.unique_key))
        settled = yield from self._copied(pending)
        pending = [job for job in pending if job.unique_key not in settled]
        for _ in range(UNIQUE_ROUNDS if pending else 0):
            for part in self._parts(pending):
                settled.update((yield from self._insert(part)))
                missed = [job for job in part if job.unique_key not in settled]
                if missed:
                    settled.update((yield from self._holders(missed)))
            pending = [job for job in pending if job.unique_key not in settled]
            if not pending:
                break
        if pending:
            raise _unsettled(pending[0])
        for key, where in places.items():
            for i in where:
                ids[i] = settled[key]

    def _copied(self, jobs: Sequence[NewJob]) -> Steps[dict[str, int]]:
        """The usual bulk case first: those of `jobs` with no idempotency key and none to
        replace a holder, by COPY (as fast as plain jobs go in), in a savepoint. If one
        meets a live holder's key, none of them stays and the INSERT takes them all,
        job by job meeting their holders (ON CONFLICT). Their ids by key (before the
        period's number); none if they went back."""
        fast = [j for j in jobs if j.idempotency_key is None and j.on_conflict != "replace"]
        if len(fast) < COPY_AT_LEAST:
            return {}
        ((now, epoch),) = yield Query(self.q["job_clock"])
        reserved = yield Query(self.q["job_ids_reserve"], {"n": len(fast)})
        ids = [int(new_id) for (new_id,) in reserved]
        rows = (
            (new_id, *column_values(j), _due(j, now), _stored_key(j, epoch), j.unique_states)
            for new_id, j in zip(ids, fast, strict=True)
        )
        if not (yield Copy(self.q["job_copy_unique"], rows, unless_taken=True)):
            return {}
        return {str(j.unique_key): new_id for new_id, j in zip(ids, fast, strict=True)}

    def _parts(self, jobs: Sequence[NewJob]) -> Iterator[Sequence[NewJob]]:
        """`jobs` in their order, by statements: a replacing job alone, the others in
        statements of at most a chunk. A statement of many takes the locks of the holders
        it replaces before it inserts: with more than one replacing job in it, it would
        lock a key after inserting a lesser one, out of key order."""
        for replace, run in itertools.groupby(jobs, key=lambda j: j.on_conflict == "replace"):
            same = list(run)
            size = 1 if replace else self.chunk
            for start in range(0, len(same), size):
                yield same[start : start + size]

    def _insert(self, jobs: Sequence[NewJob]) -> Steps[dict[str, int]]:
        """One statement inserting unique `jobs`, or replacing the holder of one that
        replaces (alone: _parts); the ids of those it inserted or replaced, by key
        before the period's number."""
        if jobs[0].on_conflict == "replace":
            given = {**values(jobs[0], UNIQUE_FIELDS), "quiet": False}  # as marked: Inserts.many
            rows = yield Query(self.q["job_insert_replace"], given)
        else:
            rows = yield Query(self.q["job_insert_many_unique"], params(jobs, UNIQUE_FIELDS))
        return {str(key).partition("@")[0]: int(id_) for id_, key in rows}

    def _holders(self, jobs: Sequence[NewJob]) -> Steps[dict[str, int]]:
        """The ids of the jobs holding the idempotency keys or the unique keys of `jobs`,
        by their unique keys (before the period's number); raises UniqueConflict for a
        job of on_conflict="raise" whose unique key is held (not its idempotency key)."""
        keys = sorted({k for job in jobs if (k := job.idempotency_key) is not None})
        taken = (yield from self.ids_by_key(keys)) if keys else {}
        found = {
            str(job.unique_key): taken[job.idempotency_key]
            for job in jobs
            if job.idempotency_key in taken
        }
        rest = [job for job in jobs if job.unique_key not in found]
        if not rest:
            return found
        unique = {
            "unique_key": [j.unique_key for j in rest],
            "unique_period": [j.unique_period for j in rest],
        }
        rows = yield Query(self.q["job_unique_holders"], unique)
        held = {str(key): int(id_) for id_, key in rows}
        for job in rest:
            if job.on_conflict == "raise" and job.unique_key in held:
                raise UniqueConflict(held[str(job.unique_key)], job.task)
        return found | held


def _due(job: NewJob, now: datetime) -> datetime:
    """When `job` is due, as _job_due says in SQL: its run_at, else `now` (the database's
    clock), plus its delay."""
    return (job.run_at or now) + timedelta(seconds=job.delay)


def _stored_key(job: NewJob, epoch: float) -> str:
    """`job`'s unique key as `_unique_key` stores it, at `epoch` seconds (the database's
    clock): with a period, `@` and the number of the period it is in."""
    if job.unique_period is None:
        return str(job.unique_key)
    return f"{job.unique_key}@{math.floor(epoch / job.unique_period)}"


def _unsettled(job: NewJob) -> DatabaseError:
    """The error of a unique insert that neither inserted nor found a holder in every
    round: the holders kept leaving their states between the two statements."""
    return DatabaseError(
        f"enqueue of a unique {job.task!r} job: its key was held, then free, "
        f"{UNIQUE_ROUNDS} times over; try again"
    )
