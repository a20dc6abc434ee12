"""The job store: the only caller of the job queries. Typed arguments in, typed rows out.

It is also their error boundary: every psycopg and pool error that leaves this package
is a forklift DatabaseError (`translated`), raised from the original.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol, TypeVar

from psycopg_pool import ConnectionPool

from forklift import _db, _sql
from forklift.store._boundary import Conn, pipelined, short_connection, translated
from forklift.store._effect import Effect
from forklift.store._listen import Notifications
from forklift.store._rows import Claim, ClaimedJob, JobState, NewJob, claimed
from forklift.store.producing import ProducerLimits

# A success to record: (job id, attempt, result JSON, progress JSON), fenced by both.
Completion = tuple[int, int, str | None, str | None]

__all__ = [
    "Claim",
    "ClaimedJob",
    "Completion",
    "Conn",
    "ConnSource",
    "Effect",
    "JobState",
    "JobStore",
    "NewJob",
    "Notifications",
    "short_connection",
    "translated",
]


_T = TypeVar("_T")

# The NewJob fields an insert takes, as its parameters are named.
_JOB_COLUMNS = (
    "queue", "task", "args", "idempotency_key", "priority", "max_attempts", "max_crashes",
    "timeout", "run_at", "delay", "batch_id", "limit_key",
)  # fmt: skip

# Rows per statement of a bulk enqueue. Each statement must end within the connection's
# statement_timeout (10 s for the producer); a keyed insert costs ~35 us a row, so 5,000
# take ~0.2 s, and 500,000 jobs are 100 statements in the one transaction.
INSERT_CHUNK = 5_000


class ConnSource(Protocol):
    """Where a store takes its connections: a pool, or one held connection (_conns.py)."""

    @property
    def conninfo(self) -> Any: ...

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]: ...

    def open(self, wait: bool = False, timeout: float = 30.0) -> None: ...

    def close(self, timeout: float = 5.0) -> None: ...


class JobStore:
    """Runs the job queries against a pool (or a caller's connection where stated).

    `effects`, if given, is the pool handlers' effect transactions take their connections
    from, apart from the worker's own statements (which never wait behind a handler).
    """

    def __init__(
        self,
        pool: ConnSource,
        schema: str,
        effects: ConnectionPool[Conn] | None = None,
        *,
        insert_chunk: int = INSERT_CHUNK,
    ) -> None:
        self.pool = pool
        self.effects = effects
        self.schema = schema
        self.insert_chunk = insert_chunk
        self.q = _sql.load("forklift.store", "queries.sql", schema)
        self.producing = ProducerLimits(pool.connection, schema)
        conninfo = pool.conninfo  # a str, or a callable that makes one per connection
        self.where = _db.describe(conninfo if isinstance(conninfo, str) else conninfo())

    # -- producing ---------------------------------------------------------------------

    def job_insert(self, job: NewJob, conn: Conn | None = None) -> int:
        params = {name: getattr(job, name) for name in _JOB_COLUMNS}
        with translated("enqueue failed", self.where):
            if conn is not None:
                return self._insert_on(conn, job, params)
            with self.pool.connection() as own:
                return self._insert_on(own, job, params)

    def _insert_on(self, conn: Conn, job: NewJob, params: dict[str, Any]) -> int:
        self.producing.prepare(conn, [job])
        params["limit_key"] = job.limit_key  # a key prepare() found
        row = conn.execute(self.q["job_insert"], params).fetchone()
        if row is not None:
            return int(row[0])
        # The key is taken: by a committed job (found now) or by one whose insert we
        # waited on; a fresh statement sees it either way.
        assert job.idempotency_key is not None
        return self._ids_by_key([job.idempotency_key], conn)[job.idempotency_key]

    def job_ids_by_key(self, keys: Sequence[str], conn: Conn) -> dict[str, int]:
        """The ids of existing jobs by idempotency key, on the caller's connection."""
        with translated("job lookup failed", self.where):
            return self._ids_by_key(keys, conn)

    def _ids_by_key(self, keys: Sequence[str], conn: Conn) -> dict[str, int]:
        rows = conn.execute(self.q["job_ids_by_key"], {"keys": list(keys)}).fetchall()
        return {key: int(id_) for id_, key in rows}

    def job_insert_many(self, jobs: Sequence[NewJob], conn: Conn | None = None) -> list[int]:
        """Insert jobs in bulk, all or nothing: COPY for plain due-now jobs, an INSERT for
        the rest, each in statements of at most `insert_chunk` rows (so none of them runs
        into the statement timeout, however many jobs), in one transaction."""
        with translated("bulk enqueue failed", self.where):
            if conn is not None:
                return self._insert_many_on(conn, jobs)
            with self.pool.connection() as own, own.transaction():
                return self._insert_many_on(own, jobs)

    def _insert_many_on(self, conn: Conn, jobs: Sequence[NewJob]) -> list[int]:
        self.producing.prepare(conn, jobs)
        # Unkeyed jobs get reserved ids up front, so every id is known without relying on
        # the order of RETURNING; keyed jobs are looked up by key.
        ids: list[int | None] = [None] * len(jobs)
        unkeyed = [i for i, j in enumerate(jobs) if j.idempotency_key is None]
        for part in self._chunks(unkeyed):
            reserved = conn.execute(self.q["job_ids_reserve"], {"n": len(part)}).fetchall()
            for i, (new_id,) in zip(part, reserved, strict=True):
                ids[i] = int(new_id)
        for part in self._chunks([i for i in unkeyed if jobs[i].due_now]):
            with conn.cursor().copy(self.q["job_copy"]) as copy:
                for i in part:
                    j = jobs[i]
                    row = (ids[i], j.queue, j.task, j.args, j.priority, j.max_attempts)
                    copy.write_row((*row, j.max_crashes, j.timeout, j.batch_id, j.limit_key))
        other = [i for i, j in enumerate(jobs) if not (j.idempotency_key is None and j.due_now)]
        by_key: dict[str, int] = {}
        for part in self._chunks(other):
            by_key.update(self._insert_rows(conn, [jobs[i] for i in part], [ids[i] for i in part]))
        # Keys taken already (by a committed job, an earlier chunk, or twice in one chunk).
        missing = sorted({k for i in other if (k := jobs[i].idempotency_key) and k not in by_key})
        for keys in self._chunks(missing):
            by_key.update(self._ids_by_key(keys, conn))
        for i in other:
            key = jobs[i].idempotency_key
            if key is not None:
                ids[i] = by_key[key]
        assert all(i is not None for i in ids)
        return [int(i) for i in ids]  # type: ignore[arg-type]

    def _insert_rows(
        self, conn: Conn, jobs: Sequence[NewJob], ids: Sequence[int | None]
    ) -> dict[str, int]:
        """One INSERT of keyed or delayed jobs; the ids of the keys it inserted."""
        cols: dict[str, list[Any]] = {"id": list(ids)}
        for k in _JOB_COLUMNS:
            cols[k] = [getattr(j, k) for j in jobs]
        rows = conn.execute(self.q["job_insert_many"], cols).fetchall()
        return {key: int(id_) for id_, key in rows if key is not None}

    def _chunks(self, items: Sequence[_T]) -> Iterator[Sequence[_T]]:
        for start in range(0, len(items), self.insert_chunk):
            yield items[start : start + self.insert_chunk]

    # -- working -----------------------------------------------------------------------

    def job_claim(
        self, queues: Sequence[str], owner: str, limit: int, lease: float, *, expired: bool
    ) -> list[ClaimedJob]:
        """Claim up to `limit` jobs; with `expired`, also jobs whose lease ran out."""
        params = {
            "queues": list(queues),
            "owner": owner,
            "limit": limit,
            "lease": lease,
            "expired": expired,
        }
        with translated("claim failed", self.where), self.pool.connection() as conn:
            rows = conn.execute(self.q["job_claim"], params).fetchall()
        return claimed(rows)

    def job_claim_completing(
        self,
        done: Sequence[Completion],
        queues: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        *,
        expired: bool,
    ) -> tuple[set[int], list[ClaimedJob]]:
        """Complete `done` (as job_complete_many), then claim (as job_claim), in one
        transaction and one round trip: the claim sees the slots they free. The ids
        completed, and the jobs claimed."""
        params = {"queues": list(queues), "owner": owner, "limit": limit, "lease": lease}
        params["expired"] = expired
        with translated("claim failed", self.where), self.pool.connection() as conn:
            completed, claim = pipelined(
                conn, [self.completion(done, owner), (self.q["job_claim"], params)]
            )
            return {r[0] for r in completed}, claimed(claim.fetchall())

    def job_next_available(self, queues: Sequence[str]) -> float | None:
        """Seconds until the next ready job of `queues` is due; None if there is none."""
        with translated("next-available lookup failed", self.where), self.pool.connection() as conn:
            row = conn.execute(self.q["job_next_available"], {"queues": list(queues)}).fetchone()
        return None if row is None else float(row[0])

    def lease_renew_many(
        self, held: Sequence[tuple[int, int]], owner: str, lease: float
    ) -> set[int]:
        """Renew (id, attempt) leases; return the ids still held."""
        params = {**_leases(held), "owner": owner, "lease": lease}
        with translated("lease renewal failed", self.where), self.pool.connection() as conn:
            return {r[0] for r in conn.execute(self.q["lease_renew_many"], params)}

    def job_complete_many(self, done: Sequence[Completion], owner: str) -> set[int]:
        """Mark (id, attempt, result JSON, progress JSON) jobs succeeded; return the ids
        completed (others were lost)."""
        with translated("completion failed", self.where), self.pool.connection() as conn:
            return {r[0] for r in conn.execute(*self.completion(done, owner))}

    def completion(self, done: Sequence[Completion], owner: str) -> tuple[str, dict[str, Any]]:
        """The statement that completes `done` (job_complete_many, or its variant that
        writes results and progress), with its parameters."""
        return completion(self.q, done, owner)

    def job_progress_many(self, held: Sequence[tuple[int, int, str]], owner: str) -> None:
        """Record (id, attempt, progress JSON) of running jobs this worker holds."""
        params = {**_leases(held), "progress": [h[2] for h in held], "owner": owner}
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
        effect = Effect(pool, self.q["job_complete_many_values"], self.q["effect_limits_end"])
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
            row = conn.execute(self.q["job_fail"], params).fetchone()
        return None if row is None else JobState(row[0])

    def job_release_many(self, held: Sequence[tuple[int, int]], owner: str) -> set[int]:
        """Give (id, attempt) jobs back to ready without counting the attempt."""
        params = {**_leases(held), "owner": owner}
        with translated("release failed", self.where), self.pool.connection() as conn:
            return {r[0] for r in conn.execute(self.q["job_release_many"], params)}

    def job_cancelled_among(self, held: Sequence[tuple[int, int]]) -> set[int]:
        """Which (id, attempt) jobs were cancelled by an operator (their lease taken)."""
        params = _leases(held)
        with translated("cancel lookup failed", self.where), self.pool.connection() as conn:
            return {r[0] for r in conn.execute(self.q["job_cancelled_among"], params)}

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
            return [r[0] for r in conn.execute(self.q["job_rescue_exhausted"])]

    def job_prune(self, keep_finished: float, keep_dead: float, limit: int = 2000) -> int:
        params = {"keep_finished": keep_finished, "keep_dead": keep_dead, "limit": limit}
        with translated("prune failed", self.where), self.pool.connection() as conn:
            conn.execute(self.q["limit_windows_prune"])
            return conn.execute(self.q["job_prune"], params).rowcount

    def jobs_owned(self) -> bool:
        """Whether this role owns the jobs table (may VACUUM it)."""
        with (
            translated("reading the jobs table's owner failed", self.where),
            self.pool.connection() as conn,
        ):
            row = conn.execute(self.q["jobs_owned"]).fetchone()
        return bool(row and row[0])

    def jobs_vacuum_due(self) -> bool:
        """Whether the jobs table's dead tuples passed the vacuum threshold."""
        with (
            translated("reading the jobs table's statistics failed", self.where),
            self.pool.connection() as conn,
        ):
            row = conn.execute(self.q["jobs_vacuum_due"]).fetchone()
        return bool(row and row[0])

    def jobs_vacuum(self) -> None:
        """VACUUM (ANALYZE) the jobs table, unless another vacuum has it."""
        with (
            translated("vacuuming the jobs table failed", self.where),
            self.pool.connection() as conn,
        ):
            # Longer than a claim may take: a big table takes seconds. RESET goes back
            # to the connection's own bound.
            conn.execute("SET statement_timeout = '10min'")
            try:
                conn.execute(self.q["jobs_vacuum"], prepare=False)
            finally:
                conn.execute("RESET statement_timeout")


def completion(
    q: dict[str, str], done: Sequence[Completion], owner: str
) -> tuple[str, dict[str, Any]]:
    params = {**_leases(done), "owner": owner}
    if not any(d[2] is not None or d[3] is not None for d in done):
        return q["job_complete_many"], params
    params["results"], params["progress"] = [d[2] for d in done], [d[3] for d in done]
    return q["job_complete_many_values"], params


def _leases(held: Sequence[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """The (id, attempt, ...) leases as the fenced queries take them."""
    return {"ids": [h[0] for h in held], "attempts": [h[1] for h in held]}


def _ms(seconds: float | None) -> str | None:
    """A PostgreSQL duration setting in milliseconds (0 would mean no bound: 1 at least)."""
    return None if seconds is None else str(max(1, int(seconds * 1000)))
