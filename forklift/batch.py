"""Batches and results: fan jobs out as one batch, fan them back in with a callback that
runs once, and wait for a job's result or a batch's end.

A batch is sealed once no more jobs will be added (at once for `App.enqueue_batch`, when
the block ends for `App.batch`); it finishes when it is sealed and every job in it has
succeeded, gone dead or been cancelled. The transaction that marks it finished enqueues
its callback, so the callback goes in exactly once, however many workers saw the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

from forklift import _deadlines, _waiting
from forklift._events import emit
from forklift._ids import operator
from forklift._job import JobSpec
from forklift.errors import (
    ArgumentError,
    BatchNotFound,
    DatabaseError,
    JobCancelled,
    JobFailed,
    JobNotFound,
)
from forklift.store import Conn, JobStore, NewJob
from forklift.store._inserts import stored
from forklift.store.batches import BatchRow, BatchStore

log = logging.getLogger(__name__)

# The key of a batch's callback job: `forklift:batch:<id>` (keys under `forklift:` are
# forklift's own). It makes a second enqueue of the callback impossible, and tells the
# callback's handler which batch it finishes (ctx.batch).
CALLBACK_KEY = "forklift:batch:"


@dataclass(frozen=True, slots=True)
class BatchStatus:
    """Where a batch stands: its jobs by state (`pending`: ready or running), whether it
    is sealed (no more jobs come) and finished (sealed, none pending; its callback is
    enqueued), its outcome then ('succeeded', 'failed': some dead, 'cancelled',
    'abandoned': its producer left it filling, see BatchWriter), and its callback's job
    id."""

    id: int
    total: int
    pending: int
    running: int
    succeeded: int
    dead: int
    cancelled: int
    sealed: bool
    finished: bool
    outcome: str | None
    callback_job_id: int | None


class Batch:
    """A batch of jobs, from any process (`App.get_batch(id)`): its status, its results,
    and a wait for its end. `job_ids` are read from the database when not known."""

    def __init__(
        self,
        batch_id: int,
        store: BatchStore,
        ends: Callable[[], _waiting.Ends],
        job_ids: list[int] | None = None,
    ) -> None:
        self.id = batch_id
        self._store = store
        self._ends = ends  # what wait() hears the end by (the process's: _waiting.ends)
        self._job_ids = job_ids

    def __repr__(self) -> str:
        return f"<forklift.Batch {self.id}>"

    @property
    def job_ids(self) -> list[int]:
        """Its jobs' ids, in the order they were added."""
        if self._job_ids is None:
            self._job_ids = self._store.job_ids(self.id)
        return list(self._job_ids)

    def status(self, conn: Conn | None = None) -> BatchStatus:
        row = self._store.get(self.id, conn)
        if row is None:
            raise BatchNotFound(f"no batch {self.id} (never made, or pruned)")
        return _status(row, self._store.counts(self.id, conn).by_state)

    def wait(self, timeout: float = 60.0) -> BatchStatus:
        """The status once the batch finished, waiting up to `timeout` seconds (woken by
        its end, polling as a fallback); TimeoutError if it did not finish by then."""

        def finished() -> BatchStatus | None:
            # The batch's row alone until it finished: its jobs are counted once, at the end.
            row = self._store.get(self.id)
            if row is None:
                raise BatchNotFound(f"no batch {self.id} (never made, or pruned)")
            return self.status() if row.finished_at is not None else None

        schema, hint = self._store.schema, f"b{self.id}"
        done = _waiting.wait_for_end(self._ends(), schema, hint, finished, timeout)
        if done is None:
            raise TimeoutError(f"batch {self.id} did not finish within {timeout:g} s")
        return done

    def results(self) -> dict[int, Any]:
        """{job id: result} of its succeeded jobs, in job order (None: returned nothing)."""
        return self._store.results(self.id)

    def dead(self) -> dict[int, str | None]:
        """{job id: last error} of its dead jobs, in job order."""
        return self._store.dead(self.id)


def existing(batch: Batch) -> Batch:
    """`batch`, once its status says it exists (BatchNotFound otherwise)."""
    batch.status()
    return batch


def _status(row: BatchRow, by_state: dict[str, int]) -> BatchStatus:
    ready, running = by_state.get("ready", 0), by_state.get("running", 0)
    return BatchStatus(
        id=row.id,
        total=row.total,
        pending=ready + running,
        running=running,
        succeeded=by_state.get("succeeded", 0),
        dead=by_state.get("dead", 0),
        cancelled=by_state.get("cancelled", 0),
        sealed=row.sealed_at is not None,
        finished=row.finished_at is not None,
        outcome=row.outcome,
        callback_job_id=row.callback_job_id,
    )


def callback_of(key: str | None) -> int | None:
    """The batch a job finishes, if it is a batch's callback (by its reserved key)."""
    if key is None or not key.startswith(CALLBACK_KEY):
        return None
    tail = key[len(CALLBACK_KEY) :]
    return int(tail) if tail.isdigit() else None


# -- making batches (App's methods call these) -------------------------------------------

Specs = Iterable[JobSpec | tuple[str, Mapping[str, Any]]]


class Named(Protocol):
    """A task, as a batch names it (forklift.Task)."""

    @property
    def name(self) -> str: ...


class Opens(Protocol):
    """An App's producer connections (forklift._producing.Producer), as batches use them."""

    def store(self, wait: float | None = None) -> JobStore: ...


class Producer(Protocol):
    """What making batches needs of their app (forklift.App): its database, its stores,
    what waiters hear ends by, and its checks of new jobs."""

    @property
    def dsn(self) -> str: ...
    @property
    def store(self) -> JobStore: ...
    @property
    def batches(self) -> BatchStore: ...
    @property
    def _producer(self) -> Opens: ...
    def ends(self) -> _waiting.Ends: ...
    def _new_job(self, task_name: str, args: Mapping[str, Any] | None) -> NewJob: ...
    def _new_jobs(self, jobs: Specs) -> list[NewJob]: ...


def callback_spec(
    app: Producer, on_complete: Named | str | None, args: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The callback job as the batch row keeps it (validated now, like any enqueue)."""
    if on_complete is None:
        if args is not None:
            raise ArgumentError("on_complete_args given without on_complete")
        return None
    name = on_complete if isinstance(on_complete, str) else on_complete.name
    return stored(app._new_job(name, args))


def member_jobs(app: Producer, specs: Specs, batch_id: int | None = None) -> list[NewJob]:
    """Validated jobs for a batch; keys are refused (the batch is the unit: a job that
    matched an existing key would not be this batch's), and so are unique jobs, for the
    same reason: a task declared unique makes plain jobs here (forklift.Unique)."""
    jobs = app._new_jobs(_not_unique(specs))
    for job in jobs:
        if job.idempotency_key is not None:
            raise ArgumentError(
                f"a batch's jobs take no idempotency key (got {job.idempotency_key!r}): "
                "a job whose key is taken would belong to another batch, or none"
            )
        job.batch_id = batch_id
        job.unique_key = job.unique_period = job.unique_states = None
    return jobs


def _not_unique(specs: Specs) -> Iterator[JobSpec | tuple[str, Mapping[str, Any]]]:
    """`specs`, refusing any that asks to be unique (ArgumentError)."""
    for spec in specs:
        if isinstance(spec, JobSpec) and (spec.unique or spec.on_conflict is not None):
            raise ArgumentError(
                f"a batch's jobs are never unique (got a {spec.task!r} job with unique= or "
                "on_conflict=): a job whose unique key is held would belong to another "
                "batch, or none"
            )
        yield spec


# How to try a batch's call again that timed out (a batch takes no idempotency key).
AGAIN = "a batch whose commit was sent may exist: see `forklift batches list` first"


def bounded_batches(app: Producer, wait: float, what: str) -> BatchStore:
    """The app's batch store, each of its calls waiting `wait` seconds at most for the
    database (as an enqueue does: _deadlines), its pool's opening included."""
    store = app._producer.store(wait)
    connect = _deadlines.connector(store.pool.connection, wait, what, AGAIN)
    return BatchStore(connect, store.schema)


def enqueue_batch(
    app: Producer,
    specs: Specs,
    on_complete: Named | str | None,
    on_complete_args: Mapping[str, Any] | None,
    conn: Conn | None,
    wait: float,
) -> Batch:
    callback = callback_spec(app, on_complete, on_complete_args)
    jobs = member_jobs(app, specs)
    what = "batch enqueue failed"
    batches = bounded_batches(app, wait, what)  # the pool opened within `wait`
    store = app._producer.store(wait)

    def insert(c: Conn, each: Callable[[], None] | None = None) -> tuple[int, list[int]]:
        batch_id = batches.create(callback, len(jobs), sealed=True, conn=c)
        for job in jobs:
            job.batch_id = batch_id
        return batch_id, store.job_insert_many(jobs, c, each=each) if jobs else []

    if conn is not None:
        batch_id, ids = insert(conn)  # an empty one finishes by the sweep, after your commit
    else:
        connection = _deadlines.connection(store.pool.connection, wait, what, AGAIN)
        with connection as (own, each), own.transaction():
            batch_id, ids = insert(own, each)  # a deadline for each statement, as in bulk
        if not jobs:
            batches.finish_if_done({batch_id})
    return Batch(batch_id, app.batches, app.ends, ids)


class BatchWriter(Batch):
    """`with app.batch(on_complete=...) as b:` a batch whose jobs are added in chunks,
    each `enqueue`/`enqueue_many` committed at once (workers may start on them while
    more are added), sealed when the block ends. If the block raises, the batch is
    cancelled (its ready and running jobs cancelled) and sealed: its callback still runs
    once, and sees that. If its producer dies in the block, maintenance seals the batch
    once no job was added for `--batch-abandon-after`: it finishes when its jobs have,
    with the outcome 'abandoned' that its callback sees."""

    def __init__(self, app: Producer, callback: dict[str, Any] | None, wait: float) -> None:
        self._app = app
        self._callback = callback
        self._wait = wait  # for the database, in each call of the block and at its end
        self._added: list[int] = []
        self._sealed = False
        super().__init__(0, bounded_batches(app, wait, "batch failed"), app.ends)

    def __enter__(self) -> BatchWriter:
        with self._store.connect() as conn:
            self.id = self._store.create(self._callback, 0, sealed=False, conn=conn)
        return self

    def enqueue(self, task: Named | str, /, **args: Any) -> int:
        """Add one job (`task` a Task or a task name, `args` its keyword arguments)."""
        name = task if isinstance(task, str) else task.name
        return self.enqueue_many([(name, args)])[0]

    def enqueue_many(self, specs: Specs) -> list[int]:
        """Add jobs (the pairs or JobSpecs App.enqueue_many takes), in one transaction."""
        if self._sealed or not self.id:
            raise ArgumentError(
                f"batch {self.id or '(not begun)'} takes no more jobs: add them inside "
                "its `with app.batch() as b:` block"
            )
        jobs = member_jobs(self._app, specs, self.id)
        if not jobs:
            return []
        store = self._app.store
        connection = _deadlines.connection(store.pool.connection, self._wait, "batch failed", AGAIN)
        with connection as (conn, each), conn.transaction():
            if not self._store.add(self.id, len(jobs), conn):
                raise ArgumentError(
                    f"batch {self.id} takes no more jobs: it was cancelled (forklift batches "
                    "cancel), sealed, or abandoned (no job added for --batch-abandon-after)"
                )
            ids = store.job_insert_many(jobs, conn, each=each)
        self._added.extend(ids)
        return ids

    @property
    def job_ids(self) -> list[int]:
        return list(self._added)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._sealed = True
        if kind is None:
            self._seal()
            return
        # The block's own exception is the one raised: what fails here is logged.
        try:  # as `forklift batches cancel` does
            self._store.cancel(self.id, operator(), f"the batch block ({kind.__name__})")
        except DatabaseError as error:
            emit(log, "batch.cancel_failed", logging.ERROR, batch=self.id, error=error)
        try:
            self._seal()
        except DatabaseError as error:  # maintenance seals it (--batch-abandon-after)
            emit(log, "batch.seal_failed", logging.ERROR, batch=self.id, error=error)

    def _seal(self) -> None:
        self._store.seal(self.id)
        self._store.finish_if_done({self.id})


def result(app: Producer, job_id: int, timeout: float) -> Any:
    """See App.result."""
    store = app.batches

    def ended() -> tuple[Any] | None:
        found = store.job_outcome(job_id)
        if found is None:
            raise JobNotFound(f"no job {job_id} (never enqueued, or pruned)")
        state, value, error = found
        if state == "succeeded":
            return (value,)
        if state == "dead":
            raise JobFailed(job_id, error)
        if state == "cancelled":
            raise JobCancelled(job_id, error)
        return None

    def mark() -> None:
        store.job_wait_mark(job_id)

    ends = _waiting.ends(app.dsn)
    done = _waiting.wait_for_end(ends, store.schema, f"j{job_id}", ended, timeout, mark)
    if done is None:
        raise TimeoutError(f"job {job_id} did not finish within {timeout:g} s")
    return done[0]
