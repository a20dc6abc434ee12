"""The supervisor's store: the only caller of supervisor/queries.sql.

In the supervisor every call runs on its one database thread, on the connection that
thread holds (`held`, see _conns.py); without one (a test, `forklift worker`) each call
opens a short, bounded connection. psycopg errors come out as DatabaseError.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg

from forklift import _db, _locks, _sql
from forklift._conns import HeldConnection
from forklift._ids import liveness_holder
from forklift.backoff import Backoff
from forklift.store import short_connection, translated

# The retry delay of a job whose worker died or was killed for it: 0.5 s after its first
# attempt, doubling per attempt, at most a minute. Never at once: a job that crashes its
# worker would kill the next one within milliseconds (its crash budget, max_crashes,
# stops it for good).
ORPHAN_RETRY = Backoff(base=0.5, factor=2.0, max=60.0, jitter=0)


def orphan_delay(retry: Backoff | None, attempts: int) -> float | None:
    """The delay before the retry of a job whose worker died in attempt `attempts`;
    None: ready at once, in its old place in line (a lost owner's job, as one whose
    lease expired)."""
    if retry is None:
        return None
    return retry.delay(max(attempts, 1))


class ChargedJob(NamedTuple):
    """A job a process death was recorded on: ready for a retry, or dead."""

    id: int
    state: str
    attempts: int
    queue: str
    task: str
    quarantined: bool = False  # dead for crashing its worker max_crashes times
    forgiven: bool = False  # not charged: its handler was never seen running (ready again)


class ReleasedJob(NamedTuple):
    """A job released, its attempt not counted."""

    id: int
    queue: str
    task: str


@dataclass(frozen=True)
class ProcessInfo:
    """One row of the process registry, as this supervisor reports it."""

    id: str
    kind: str
    host: str
    pid: int
    supervisor_id: str | None
    queues: str
    current_job: int | None
    rss_bytes: int | None
    uptime: float
    labels: str = ""  # comma-separated (forklift run --labels)


class SupervisorStore:
    def __init__(
        self, dsn: str, schema: str, timeouts: _db.Timeouts, held: HeldConnection | None = None
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.timeouts = timeouts
        self.held = held
        self.q = _sql.load("forklift.supervisor", "queries.sql", schema)
        # The worker's own lookup of what committed with its answer lost, asked here of a
        # dead child's unanswered group commit: one statement for both.
        self.job_q = _sql.load("forklift.store", "queries.sql", schema)
        self._where = _db.describe(dsn)

    def _conn(self, what: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        if self.held is not None:
            return _on_held(self.held, what, self._where)
        return short_connection(self.dsn, self.timeouts, "forklift-supervisor", what)

    def _liveness_key(self, owner: str) -> int:
        return _locks.lock_key(_locks.liveness(self.schema, liveness_holder(owner)))

    def job_fail_orphaned(
        self,
        owner: str,
        error: str,
        *,
        ids: Sequence[int] | None = None,
        retry: Backoff | None = ORPHAN_RETRY,
        crash: bool = True,
        unlocked: bool = False,
        forgive: bool = False,
    ) -> list[ChargedJob]:
        """Charge a process death to the jobs `owner` held (all, or just `ids`); with
        `unlocked`, only if its liveness lock is free as the jobs are locked; with
        `forgive` (which handlers ran is not known), not to a job whose handler its lease
        renewals never saw running: that one is ready again at once, one attempt more.

        One transaction: lock the owner's running jobs, then charge each with the retry
        delay its attempt count earns (`retry` None: ready at once, in its old place in
        line, as a job whose lease expired is). With `crash` (the death was the job's
        doing, not a timeout's) each is charged a crash too, and quarantined at its
        max_crashes.
        """
        wanted = {
            "owner": owner,
            "ids": list(ids) if ids is not None else None,
            "unlocked": unlocked,
            "key": self._liveness_key(owner),
        }
        with self._conn("recording a worker's death failed") as c, c.transaction():
            held = c.execute(self.q["job_held_by_owner"], wanted).fetchall()
            if not held:
                return []
            params = {
                "owner": owner,
                "error": error,
                "ids": [job_id for job_id, _ in held],
                "delays": [orphan_delay(retry, a) for _, a in held],
                "crash": crash,
                "forgive": forgive,
            }
            return _db.rows(c.execute(self.q["job_fail_orphaned"], params), ChargedJob)

    def job_release_owner(self, owner: str) -> list[ReleasedJob]:
        with self._conn("releasing a worker's jobs failed") as c:
            return _db.rows(c.execute(self.q["job_release_owner"], {"owner": owner}), ReleasedJob)

    def job_let_go_cancelled(self, owner: str) -> int:
        """End the holds of the cancelled jobs a dead (or killed) worker process still
        held (their handlers ran on after the cancel): their limits' slots free. How many."""
        with self._conn("letting go of a worker's cancelled jobs failed") as c:
            return _db.count(c.execute(self.q["job_let_go_cancelled"], {"owner": owner}))

    def owners_unlocked(self) -> list[str]:
        """The owners of running jobs whose liveness lock (their supervisor's, or their
        own) no session holds now."""
        with self._conn("looking for vanished workers failed") as c:
            owners: list[str] = _db.scalars(c.execute(self.q["job_running_owners"]))
            if not owners:
                return []
            names = {o: _locks.liveness(self.schema, liveness_holder(o)) for o in owners}
            held = _locks.held_by_anyone(c, sorted(set(names.values())))
        return [owner for owner, name in names.items() if name not in held]

    def backend_terminate(self, application_name: str) -> int:
        """End the sessions called `application_name`; how many there were."""
        with self._conn("ending a worker's sessions failed") as c:
            return _db.count(c.execute(self.q["backend_terminate"], {"name": application_name}))

    def job_backlog(self, queues: Sequence[str], cap: int = 10_000) -> int:
        params = {"queues": list(queues), "cap": cap}
        with self._conn("reading the backlog failed") as c:
            return _db.count(c.execute(self.q["job_backlog"], params))

    def backend_count(self, application_name: str) -> int:
        with self._conn("counting a worker's sessions failed") as c:
            return _db.count(c.execute(self.q["backend_count"], {"name": application_name}))

    def job_succeeded_among(self, held: Sequence[tuple[int, int]]) -> set[int]:
        """Which (id, attempt) succeeded on that attempt (store/queries.sql)."""
        params = {"ids": [h[0] for h in held], "attempts": [h[1] for h in held]}
        with self._conn("reading a dead child's completions failed") as c:
            return set(_db.scalars(c.execute(self.job_q["job_succeeded_among"], params)))

    def process_upsert_many(self, rows: Sequence[ProcessInfo]) -> None:
        fields = ProcessInfo.__dataclass_fields__
        params = {name: [getattr(r, name) for r in rows] for name in fields}
        with self._conn("process heartbeat failed") as c:
            c.execute(self.q["process_upsert_many"], params)

    def process_forget(self, supervisor_id: str, keep: Sequence[str]) -> None:
        params = {"supervisor_id": supervisor_id, "keep": list(keep)}
        with self._conn("process deregistration failed") as c:
            c.execute(self.q["process_forget"], params)

    def process_prune_stale(self, stale: float) -> list[str]:
        """Drop the registry rows of processes silent for `stale` seconds. Display only:
        a late heartbeat is no proof of death, so no job is charged here."""
        with self._conn("pruning stale processes failed") as c:
            return _db.scalars(c.execute(self.q["process_prune_stale"], {"stale": stale}))


@contextmanager
def _on_held(held: HeldConnection, what: str, where: str) -> Iterator[psycopg.Connection[Any]]:
    with translated(what, where), held.connection() as conn:
        yield conn
