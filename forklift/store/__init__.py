"""The job store: the only caller of the job queries. Typed arguments in, typed rows out.

It is also their error boundary: every psycopg and pool error that leaves this package
is a forklift DatabaseError (`translated`), raised from the original.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import datetime
from typing import Any, NamedTuple, Protocol

from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from forklift import _db, _deadlines, _names, _sql
from forklift._db import LiveAsyncPool
from forklift.store import _rows, _steps
from forklift.store._boundary import AsyncConn, Conn, pipelined, short_connection, translated
from forklift.store._effect import AsyncEffect, Effect, EffectBudget
from forklift.store._inserts import Inserts
from forklift.store._listen import Notifications
from forklift.store._notifier import Notifier
from forklift.store._rows import Claim, ClaimedJob, JobState, NewJob
from forklift.store.producing import ProducerLimits

# A success to record: (job id, attempt, result JSON, progress JSON), fenced by both.
Completion = tuple[int, int, str | None, str | None]

__all__ = [
    "AsyncEffect",
    "AsyncEffectSource",
    "Claim",
    "ClaimedJob",
    "Completion",
    "Conn",
    "ConnSource",
    "Effect",
    "EffectBudget",
    "JobState",
    "JobStore",
    "NewJob",
    "Notifications",
    "short_connection",
    "translated",
]


# Rows per statement of a bulk enqueue. Each statement must end within the connection's
# statement_timeout (10 s for the producer); a keyed insert costs ~35 us a row, so 5,000
# take ~0.2 s, and 500,000 jobs are 100 statements in the one transaction.
INSERT_CHUNK = 5_000


class TraceContext(NamedTuple):
    """A job_trace_contexts row."""

    id: int
    trace_context: Any


class ConnSource(Protocol):
    """Where a store takes its connections: a pool, or one held connection (_conns.py)."""

    @property
    def conninfo(self) -> Any: ...

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]: ...

    def open(self, wait: bool = False, timeout: float = 30.0) -> None: ...

    def close(self, timeout: float = 5.0) -> None: ...


class AsyncEffectSource(Protocol):
    """Where async handlers' effect transactions take their connections (a worker's)."""

    budget: EffectBudget

    async def pool(self) -> LiveAsyncPool: ...


class JobStore:
    """Runs the job queries against a pool (or a caller's connection where stated).

    `effects`, if given, is the pool handlers' effect transactions take their connections
    from, apart from the worker's own statements (which never wait behind a handler);
    `async_effects` the async handlers' one, and `budget` their bound together (--pool).
    """

    def __init__(
        self,
        pool: ConnSource,
        schema: str,
        effects: ConnectionPool[Conn] | None = None,
        *,
        insert_chunk: int = INSERT_CHUNK,
        async_effects: AsyncEffectSource | None = None,
    ) -> None:
        self.pool = pool
        self.effects = effects
        self.async_effects = async_effects
        self.budget = async_effects.budget if async_effects is not None else None
        self.schema = schema
        self.q = {
            **_sql.load("forklift.store", "queries.sql", schema),
            **_sql.load("forklift.store", "fair.sql", schema),
        }
        self.producing = ProducerLimits(schema)
        self.inserts = Inserts(self.q, self.producing, insert_chunk)
        conninfo = pool.conninfo  # a str, or a callable that makes one per connection
        self.where = _db.describe(conninfo if isinstance(conninfo, str) else conninfo())
        self.notifier = Notifier(pool.connection, self.q["wake"], conninfo)

    # -- producing ---------------------------------------------------------------------

    # Each enqueue is written once, as steps (_steps.py): `job_insert` and
    # `job_insert_many` drive them on a sync connection, their `_async` twins on a
    # caller's AsyncConnection. In a caller's transaction the insert notifies the workers
    # at its commit; on the store's own connection it may commit quietly, the notifier
    # notifying them after (migration 0010, _notifier.py).

    def job_insert(
        self, job: NewJob, conn: Conn | None = None, *, wait: float | None = None
    ) -> int:
        """Insert one job, in `conn`'s transaction or on the store's own connection (its
        waits for the database bounded by `wait`: _deadlines.connection)."""
        with translated("enqueue failed", self.where):
            if conn is not None:
                return _steps.run(self.inserts.one(job), conn, self.pool.connection)
            with (
                self.notifier.enqueuing([job.queue]) as quiet,
                _deadlines.connection(self.pool.connection, wait, "enqueue failed") as (own, _),
            ):
                # A job's few statements share the call's one deadline (no rearm).
                return _steps.run(self.inserts.one(job, quiet=quiet), own, self.pool.connection)

    async def job_insert_async(self, job: NewJob, conn: AsyncConn) -> int:
        """job_insert on the caller's AsyncConnection (in its transaction)."""
        with translated("enqueue failed", self.where):
            return await _steps.run_async(self.inserts.one(job), conn, self.pool.connection)

    def job_ids_by_key(self, keys: Sequence[str], conn: Conn) -> dict[str, int]:
        """The ids of existing jobs by idempotency key, on the caller's connection."""
        with translated("job lookup failed", self.where):
            return _steps.run(self.inserts.ids_by_key(keys), conn, self.pool.connection)

    def job_insert_many(
        self,
        jobs: Iterable[NewJob],
        conn: Conn | None = None,
        *,
        count: int | None = None,
        wait: float | None = None,
        each: Callable[[], None] | None = None,
    ) -> list[int]:
        """Insert jobs in bulk, all or nothing, in one transaction: COPY for plain due-now
        jobs, an INSERT for the rest, in statements of at most `inserts.chunk` rows. With
        `count`, `jobs` is an iterator of that many, which may validate each as it is
        taken (what it raises rolls the transaction back): only with no `conn`. `wait`: as
        job_insert's; on `conn`, `each` is called before each statement (a caller's
        deadline restarted: _deadlines.connection)."""
        if count is None:
            jobs = listed = list(jobs)
            count = len(listed)
        with translated("bulk enqueue failed", self.where):
            if conn is not None:
                return _steps.run(self.inserts.many(jobs, count), conn, self.pool.connection, each)
            queues: set[str] = set()  # what to wake once committed, noted as they go in
            connection = _deadlines.connection(self.pool.connection, wait, "bulk enqueue failed")
            with (
                self.notifier.enqueuing(queues, bulk=True) as quiet,
                connection as (own, each),
                own.transaction(),
            ):
                steps = self.inserts.many(jobs, count, quiet=quiet, queues=queues)
                return _steps.run(steps, own, self.pool.connection, each)

    async def job_insert_many_async(self, jobs: Sequence[NewJob], conn: AsyncConn) -> list[int]:
        """job_insert_many on the caller's AsyncConnection (in its transaction)."""
        with translated("bulk enqueue failed", self.where):
            steps = self.inserts.many(jobs, len(jobs))
            return await _steps.run_async(steps, conn, self.pool.connection)

    # -- working -----------------------------------------------------------------------

    def job_claim(
        self, queues: Sequence[str], owner: str, limit: int, lease: float, *, expired: bool
    ) -> list[ClaimedJob]:
        """Claim up to `limit` jobs; with `expired`, also jobs whose lease ran out."""
        return self.job_claim_next((), queues, owner, limit, lease, expired=expired).jobs

    def job_claim_next(
        self,
        done: Sequence[Completion],
        queues: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        *,
        expired: bool,
        floor: datetime | None = None,
        fair: bool = False,
        labels: Sequence[str] = (),
    ) -> Claim:
        """Complete `done` (as job_complete_many) if any, then claim as job_claim (from
        `floor`, None: a rewind; `fair`: in turns across fair keys, job_claim_fair;
        `labels`: the jobs that require them, job_claim_labelled) in one transaction and
        round trip, the claim seeing the slots they free. A claim alone commits without
        waiting for its flush."""
        claiming = claim_statement(
            self.q, queues, owner, limit, lease, expired, done, floor, fair=fair, labels=labels
        )
        with translated("claim failed", self.where), self.pool.connection() as conn:
            if not done:
                cursor = conn.cursor(row_factory=dict_row)
                rows, completed = cursor.execute(*claiming).fetchall(), set()
            else:
                completing, claim = pipelined(conn, [self.completion(done, owner), claiming])
                claim.row_factory = dict_row
                rows, completed = claim.fetchall(), set(_db.column(completing, "id"))
        return _rows.claim(rows, limit, completed)

    def job_next_available(self, queues: Sequence[str], since: float = 0.0) -> float | None:
        """Seconds until a job a plain claim `since` s ago could take falls due; None: none."""
        params = {"queues": list(queues), "since": since}
        with translated("next-available lookup failed", self.where), self.pool.connection() as conn:
            return _seconds(_db.scalar(conn.execute(self.q["job_next_available"], params)))

    def lease_renew_many(
        self,
        held: Sequence[tuple[int, int]],
        owner: str,
        lease: float,
        seen: Sequence[int] = (),
    ) -> set[int]:
        """Renew (id, attempt) leases; return the ids still held. Those `seen` (their
        handlers called) are seen running: a lost lease charges them."""
        params = {**_leases(held), "owner": owner, "lease": lease, "seen": list(seen)}
        with translated("lease renewal failed", self.where), self.pool.connection() as conn:
            return set(_db.scalars(conn.execute(self.q["lease_renew_many"], params)))

    def job_complete_many(self, done: Sequence[Completion], owner: str) -> set[int]:
        """Mark (id, attempt, result JSON, progress JSON) jobs succeeded; return the ids
        completed (others were lost)."""
        with translated("completion failed", self.where), self.pool.connection() as conn:
            return set(_db.column(conn.execute(*self.completion(done, owner)), "id"))

    def completion(self, done: Sequence[Completion], owner: str) -> tuple[str, dict[str, Any]]:
        """The statement that completes `done` (job_complete_many, or its variant that
        writes results and progress), with its parameters."""
        return completion(self.q, done, owner)

    def job_progress_many(self, held: Sequence[tuple[int, int, str]], owner: str) -> None:
        """Record (id, attempt, progress JSON) of running jobs this worker holds."""
        params = {**_leases(held, progress=2), "owner": owner}
        with translated("progress record failed", self.where), self.pool.connection() as conn:
            conn.execute(self.q["job_progress_many"], params)

    def effect_begin(
        self, idle_limit: float | None = None, statement_limit: float | None = None
    ) -> Effect:
        """Open a handler's effect transaction, in which its job's completion will commit;
        it may sit idle `idle_limit` seconds, and each statement in it may take
        `statement_limit` seconds (default, either: the session's bound)."""
        pool = self.effects if self.effects is not None else self.pool
        assert isinstance(pool, ConnectionPool), "effects need a pool"
        budget = self.budget
        if budget is not None:
            budget.take()
        effect = Effect(
            pool, self.q["job_complete_many_values"], self.q["effect_limits_end"],
            on_return=budget.give if budget is not None else None,
        )  # fmt: skip
        set_local = getattr(pool, "set_local", None)  # behind a pooler: the bounds, per txn
        limited = idle_limit is not None or statement_limit is not None
        if set_local or limited:
            params = {"idle_ms": _ms(idle_limit), "statement_ms": _ms(statement_limit)}
            try:
                with translated("effect transaction failed"):
                    if set_local:
                        effect.conn.execute(set_local)
                    if limited:
                        effect.conn.execute(self.q["effect_limits"], params)
            except BaseException:
                effect.rollback()
                raise
        return effect

    async def effect_begin_async(
        self, idle_limit: float | None = None, statement_limit: float | None = None
    ) -> AsyncEffect:
        """effect_begin for an async handler: an AsyncConnection from the async pool,
        the same bounds and completion."""
        source = self.async_effects
        assert source is not None, "async effects need a worker's async pool"
        with translated("effect transaction failed"):
            pool = await source.pool()
        await source.budget.take_async()
        effect = await AsyncEffect.begin(
            pool, self.q["job_complete_many_values"], self.q["effect_limits_end"],
            on_return=source.budget.give,
        )  # fmt: skip
        params = {"idle_ms": _ms(idle_limit), "statement_ms": _ms(statement_limit)}
        try:
            with translated("effect transaction failed"):
                if pool.set_local:
                    await effect.conn.execute(pool.set_local)
                if idle_limit is not None or statement_limit is not None:
                    await effect.conn.execute(self.q["effect_limits"], params)
        except BaseException:
            await effect.rollback()
            raise
        return effect

    def job_fail(
        self,
        job_id: int,
        attempt: int,
        owner: str,
        *,
        dead: bool,
        delay: float,
        error: str,
        traceback: str | None,
    ) -> JobState | None:
        """Record a failed attempt; return the new state, or None if the lease was lost."""
        params = {
            "id": job_id,
            "attempt": attempt,
            "owner": owner,
            "dead": dead,
            "delay": delay,
            "error": error,
            "traceback": traceback,
        }
        with translated("failure record failed", self.where), self.pool.connection() as conn:
            states = _db.column(conn.execute(self.q["job_fail"], params), "state")
        return JobState(states[0]) if states else None

    def job_release_many(self, held: Sequence[tuple[int, int]], owner: str) -> set[int]:
        """Give (id, attempt) jobs back to ready without counting the attempt."""
        params = {**_leases(held), "owner": owner}
        with translated("release failed", self.where), self.pool.connection() as conn:
            return set(_db.scalars(conn.execute(self.q["job_release_many"], params)))

    def job_cancelled_among(self, held: Sequence[tuple[int, int]]) -> set[int]:
        """Which (id, attempt) jobs were cancelled by an operator (their lease taken)."""
        params = _leases(held)
        with translated("cancel lookup failed", self.where), self.pool.connection() as conn:
            return set(_db.scalars(conn.execute(self.q["job_cancelled_among"], params)))

    @contextmanager
    def channel_listen(self, dsn: str, timeouts: _db.Timeouts) -> Iterator[Notifications]:
        """A dedicated connection LISTENing for ready jobs and operators' orders, closed
        after the block.

        Never a pooled one: a connection in LISTEN state serves nothing else.
        """
        with short_connection(dsn, timeouts, "forklift-listener", "listen failed") as conn:
            # The job channel last: pg_stat_activity shows it as the connection's query,
            # which is what tests and benchmarks wait on.
            conn.execute(self.q["control_listen"])
            conn.execute(self.q["channel_listen"])
            yield Notifications(conn)

    # -- maintenance -------------------------------------------------------------------

    def job_rescue_exhausted(self) -> list[int]:
        with translated("rescue failed", self.where), self.pool.connection() as conn:
            return _db.scalars(conn.execute(self.q["job_rescue_exhausted"]))

    def job_prune(self, keep_finished: float, keep_dead: float, limit: int = 2000) -> int:
        params = {"keep_finished": keep_finished, "keep_dead": keep_dead, "limit": limit}
        with translated("prune failed", self.where), self.pool.connection() as conn:
            conn.execute(self.q["limit_windows_prune"])
            return conn.execute(self.q["job_prune"], params).rowcount


# -- maintenance's VACUUM ---------------------------------------------------------------


def jobs_owned(store: JobStore) -> bool:
    """Whether this role owns the jobs table (may VACUUM it)."""
    with (
        translated("reading the jobs table's owner failed", store.where),
        store.pool.connection() as conn,
    ):
        return bool(_db.scalar(conn.execute(store.q["jobs_owned"])))


class VacuumDue(NamedTuple):
    """Whether the jobs table's dead tuples passed the vacuum threshold, and the oldest
    transaction id still held (64 bits): no VACUUM removes what it or a later one deleted."""

    due: bool
    horizon: int


def jobs_vacuum_due(store: JobStore) -> VacuumDue:
    """Whether the jobs table is due a VACUUM, and the horizon it would vacuum below."""
    with (
        translated("reading the jobs table's statistics failed", store.where),
        store.pool.connection() as conn,
    ):
        due = _db.one(conn.execute(store.q["jobs_vacuum_due"]), VacuumDue)
        assert due is not None  # one row, always
        return due


def jobs_vacuum(store: JobStore, conn: Conn | None = None) -> None:
    """VACUUM (ANALYZE) the jobs table, unless another vacuum has it; on `conn` if given
    (an autocommit connection in no transaction: VACUUM refuses to run in one), else on
    one of the store's."""
    with (
        translated("vacuuming the jobs table failed", store.where),
        nullcontext(conn) if conn is not None else store.pool.connection() as conn,
    ):
        # Longer than a claim may take: a big table takes seconds. RESET goes back to the
        # connection's own bound.
        conn.execute("SET statement_timeout = '10min'")
        try:
            conn.execute(store.q["jobs_vacuum"], prepare=False)
        finally:
            conn.execute("RESET statement_timeout")


# -- reconciling statements whose answer was lost with their connection ------------------


def job_succeeded_among(store: JobStore, held: Sequence[tuple[int, int]]) -> set[int]:
    """Which (id, attempt) jobs succeeded at that attempt (a completion whose answer was
    lost: did it commit?)."""
    params = _leases(held)
    with translated("completion check failed", store.where), store.pool.connection() as conn:
        return set(_db.scalars(conn.execute(store.q["job_succeeded_among"], params)))


# -- checkpoints (workers/checkpoints.py) -----------------------------------------------


def job_checkpoint_many(
    store: JobStore, held: Sequence[tuple[int, int, str]], owner: str, conn: Conn | None = None
) -> set[int]:
    """Record (id, attempt, checkpoint JSON) of running jobs `owner` holds, each only over
    an older version; the ids still ours. On `conn` (an effect transaction, which commits
    it) if given, else on a connection of the store's own."""
    params = {**_leases(held, checkpoints=2), "owner": owner}
    with translated("checkpoint write failed", store.where):
        if conn is not None:
            return set(_db.scalars(conn.execute(store.q["job_checkpoint_many"], params)))
        with store.pool.connection() as own:
            return set(_db.scalars(own.execute(store.q["job_checkpoint_many"], params)))


async def job_checkpoint_many_async(
    store: JobStore, held: Sequence[tuple[int, int, str]], owner: str, conn: AsyncConn
) -> set[int]:
    """job_checkpoint_many in an async handler's effect transaction."""
    params = {**_leases(held, checkpoints=2), "owner": owner}
    with translated("checkpoint write failed", store.where):
        cursor = await conn.execute(store.q["job_checkpoint_many"], params)
        return {row[0] for row in await cursor.fetchall()}


def job_checkpoint(store: JobStore, job_id: int, conn: Conn | None = None) -> tuple[Any, float]:
    """The job's checkpoint document (None: none) and its age in seconds."""
    with translated("checkpoint read failed", store.where):
        if conn is not None:
            row = conn.execute(store.q["job_checkpoint"], {"id": job_id}).fetchone()
        else:
            with store.pool.connection() as own:
                row = own.execute(store.q["job_checkpoint"], {"id": job_id}).fetchone()
    if row is None or row[0] is None:
        return None, 0.0
    return row[0], float(row[1] or 0.0)


# -- snoozes (forklift.Snooze; workers/recorder.py) -------------------------------------


class Snoozed(NamedTuple):
    """A job_snooze_many row: whether the job snoozed (False: its task's max_snoozes was
    reached, and it is still running, ours to fail), and its snoozes before this one."""

    id: int
    snoozed: bool
    snoozes: int


def job_snooze_many(
    store: JobStore, held: Sequence[tuple[int, int, float, int]], owner: str
) -> list[Snoozed]:
    """Give (id, attempt, delay, max_snoozes) jobs back to ready after `delay` seconds
    (database clock), attempt not counted, unless they have max_snoozes already; a row
    for each lease `owner` still holds (a lease lost has none)."""
    params = {**_leases(held, delays=2, bounds=3), "owner": owner}
    with translated("snooze failed", store.where), store.pool.connection() as conn:
        return _db.rows(conn.execute(store.q["job_snooze_many"], params), Snoozed)


def job_trace_contexts(store: JobStore, ids: Sequence[int]) -> list[tuple[int, Any]]:
    """(id, trace context) of the jobs among `ids` enqueued with one (_tracing.py)."""
    with translated("trace context lookup failed", store.where), store.pool.connection() as conn:
        cursor = conn.execute(store.q["job_trace_contexts"], {"ids": list(ids)})
        return [(row.id, row.trace_context) for row in _db.rows(cursor, TraceContext)]


def job_release_unknown(store: JobStore, owner: str, known: Sequence[int]) -> set[int]:
    """Give back, attempt not counted, the jobs `owner` holds that are not among `known`
    (claimed by a statement whose answer was lost); the ids released."""
    params = {"owner": owner, "known": list(known)}
    with translated("claim reconciliation failed", store.where), store.pool.connection() as conn:
        return set(_db.scalars(conn.execute(store.q["job_release_unknown"], params)))


def job_release_requiring(
    store: JobStore, held: Sequence[tuple[int, int, str]], owner: str
) -> set[int]:
    """Give (id, attempt, requires) jobs back as job_release_many, storing the labels
    their task requires (job_release_requiring); the ids released."""
    params = {**_leases(held, requires=2), "owner": owner}
    with translated("release failed", store.where), store.pool.connection() as conn:
        return set(_db.scalars(conn.execute(store.q["job_release_requiring"], params)))


def claim_statement(
    q: dict[str, str],
    queues: Sequence[str],
    owner: str,
    limit: int,
    lease: float,
    expired: bool,
    done: Sequence[Completion],
    floor: datetime | None,
    *,
    fair: bool = False,
    labels: Sequence[str] = (),
) -> tuple[str, dict[str, Any]]:
    """The claim to run: job_claim_labelled of the jobs that require `labels` (a labelled
    worker's first); job_claim_fair where fair jobs wait (`fair`); job_claim_one for
    one queue without the expiry scan (the usual claim, planned in half the time, its
    default priority read from `floor`), job_claim otherwise. Alone in its transaction
    (no completions `done` with it), it commits without waiting for its WAL flush
    (queries.sql, `_claim_commit`)."""
    common = {"owner": owner, "limit": limit, "lease": lease, "alone": not done}
    if labels:
        return q["job_claim_labelled"], {
            "queues": list(queues), "expired": expired, "labels": list(labels),
            "sets": _names.label_sets(tuple(labels)), **common
        }  # fmt: skip
    common["labels"] = []  # (lost jobs that require labels are the labelled claim's)
    if fair:
        return q["job_claim_fair"], {"queues": list(queues), "expired": expired, **common}
    if len(queues) == 1 and not expired:
        return q["job_claim_one"], {"queue": queues[0], "floor": floor, **common}
    return q["job_claim"], {"queues": list(queues), "expired": expired, **common}


def completion(
    q: dict[str, str], done: Sequence[Completion], owner: str
) -> tuple[str, dict[str, Any]]:
    if not any(d[2] is not None or d[3] is not None for d in done):
        return q["job_complete_many"], {**_leases(done), "owner": owner}
    return q["job_complete_many_values"], {**_leases(done, results=2, progress=3), "owner": owner}


def _seconds(value: Any) -> float | None:
    return None if value is None else float(value)


def _leases(held: Sequence[tuple[Any, ...]], **columns: int) -> dict[str, list[Any]]:
    """The (id, attempt, ...) leases as the fenced queries take them: in id order, the
    order those that write lock them in; `columns` names more arrays, by their place in
    each lease (results=2: the third of each)."""
    ordered = sorted(held, key=lambda h: h[0])
    params = {"ids": [h[0] for h in ordered], "attempts": [h[1] for h in ordered]}
    for name, place in columns.items():
        params[name] = [h[place] for h in ordered]
    return params


def _ms(seconds: float | None) -> str | None:
    """A PostgreSQL duration setting in milliseconds (0 would mean no bound: 1 at least)."""
    return None if seconds is None else str(max(1, int(seconds * 1000)))
