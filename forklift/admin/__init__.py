"""The operator's stores: queue statistics, paused queues, limits and the process list
(status, ps, queues, gauges) here; jobs (list, show, retry, cancel, purge) in `jobs.py`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from forklift import _db, _names, _sql
from forklift._ids import operator
from forklift.admin._connect import Connector
from forklift.admin.jobs import JobAdmin
from forklift.admin.rows import LimitChange, LimitRow, limit_text
from forklift.errors import ArgumentError, SchemaMissing
from forklift.scheduler.store import ScheduleRow, ScheduleSession

__all__ = [
    "AdminStore",
    "Connector",
    "JobAdmin",
    "LimitChange",
    "LimitRow",
    "PausedQueue",
    "ProcessRow",
    "QueueStats",
    "checked_queue",
]

# Due, scheduled and dead jobs a queue's statistics count up to (more read as this many).
DEPTH_CAP = 10_000


@dataclass(frozen=True)
class QueueStats:
    """One queue, as `forklift status` and the queue gauges show it. Its due, scheduled
    and dead counts stop at the cap they were read with (DEPTH_CAP): that count means
    "that many or more"."""

    queue: str
    ready: int  # due now
    scheduled: int  # ready, but due later (delayed, or retrying after a backoff)
    running: int
    dead: int
    oldest_ready_age: float | None  # seconds the oldest due job has waited; None: none due
    succeeded_last_minute: int = 0
    dead_last_minute: int = 0
    succeeded_last_hour: int = 0
    dead_last_hour: int = 0
    paused: bool = False  # no worker claims from it (forklift queues pause)
    # Its limits (forklift queues limit); None: no such limit.
    concurrency: int | None = None
    rate: int | None = None  # starts in any window of `per` seconds
    per: float | None = None
    max_depth: int | None = None
    rejected: int = 0  # enqueues refused by max_depth
    blocked: int = 0  # workflow jobs waiting for their upstream jobs
    # Ready jobs that require labels no registered worker of the queue has (among the
    # first DEPTH_CAP that require labels): they wait until such a worker starts.
    unrunnable: int = 0

    def limits(self) -> str:
        """Its limits as people read them, `concurrency 4, 10/1s, max depth 10000`; empty:
        none."""
        return limit_text(self.concurrency, self.rate, self.per, self.max_depth)


@dataclass(frozen=True)
class PausedQueue:
    queue: str
    paused_at: datetime
    paused_for: float  # seconds
    paused_by: str


@dataclass(frozen=True)
class ProcessRow:
    id: str
    kind: str
    host: str
    pid: int
    supervisor_id: str | None
    queues: list[str]
    current_job: int | None
    rss_bytes: int | None
    uptime: float
    heartbeat_age: float
    labels: Sequence[str] = ()  # forklift run --labels


class QueueDepth(NamedTuple):
    """A queue_depth row: a queue's jobs by state, counted up to the cap."""

    queue: str
    ready: int = 0
    scheduled: int = 0
    running: int = 0
    dead: int = 0
    oldest_ready_age: float | None = None
    blocked: int = 0
    unrunnable: int = 0


class QueueFinished(NamedTuple):
    """A queue_finished row: a queue's jobs that ended in the window."""

    queue: str
    succeeded: int = 0
    dead: int = 0


class QueueLimit(NamedTuple):
    """A queue's limits row as queue_limit_lock and queue_limit_set read it."""

    id: int
    concurrency: int | None
    rate: int | None
    per: float | None
    max_depth: int | None
    rejected: int = 0


class AdminStore:
    """Short, bounded connections; safe to call from the supervisor's database thread."""

    def __init__(
        self,
        dsn: str,
        schema: str,
        timeouts: _db.Timeouts | None = None,
        connector: Connector | None = None,
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.timeouts = timeouts or _db.Timeouts(connect=2.0, statement=2.0, lock=1.0)
        self.connector = connector or Connector(dsn, self.timeouts)
        self.q = _sql.load("forklift.admin", "queries.sql", schema)
        self.sq = _sql.load("forklift.scheduler", "queries.sql", schema)

    def _conn(self, what: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        return self.connector.conn(what)

    def queue_stats(
        self,
        *,
        throughput: bool = True,
        hour: bool = True,
        include: Sequence[str] = (),
        cap: int = DEPTH_CAP,
    ) -> list[QueueStats]:
        """Per-queue counts, sorted by queue; queues in `include` appear even when empty.

        The counts by state come from the partial indexes, whatever the finished rows
        retained; due, scheduled and dead stop at `cap` (the metrics, `top` and the
        dashboard read them every second or so: a backlog of millions costs what one of
        `cap` does). `throughput` adds what finished in the last minute and, with `hour`, the
        last hour: ranges of the completion-time index, whose cost grows with the jobs
        finished in them (so the metrics endpoint leaves both out, `top` the hour).
        Paused and limited queues appear too.
        """
        with self._conn("reading queue statistics failed") as conn:
            cursor = conn.execute(self.q["queue_depth"], {"cap": cap})
            depth = {d.queue: d for d in _db.rows(cursor, QueueDepth)}
            minute = self._finished(conn, 60.0) if throughput else {}
            last_hour = self._finished(conn, 3600.0) if throughput and hour else {}
            cursor = conn.execute(self.q["queue_paused_list"])
            paused = {p.queue for p in _db.rows(cursor, PausedQueue)}
            limits = {
                r.name: r
                for r in _db.rows(conn.execute(self.q["limit_list"]), LimitRow)
                if r.scope == "queue"
            }
        names = sorted(
            set(depth) | set(minute) | set(last_hour) | set(include) | paused | set(limits)
        )
        stats = []
        for q in names:
            d = depth.get(q) or QueueDepth(q)
            m = minute.get(q) or QueueFinished(q)
            h = last_hour.get(q) or QueueFinished(q)
            stats.append(
                QueueStats(
                    q,
                    d.ready,
                    d.scheduled,
                    d.running,
                    d.dead,
                    d.oldest_ready_age,
                    succeeded_last_minute=m.succeeded,
                    dead_last_minute=m.dead,
                    succeeded_last_hour=h.succeeded,
                    dead_last_hour=h.dead,
                    paused=q in paused,
                    blocked=d.blocked,
                    unrunnable=d.unrunnable,
                    **_limits_of(limits.get(q)),
                )
            )
        return stats

    def _finished(self, conn: psycopg.Connection[Any], window: float) -> dict[str, QueueFinished]:
        cursor = conn.execute(self.q["queue_finished"], {"window": window})
        return {f.queue: f for f in _db.rows(cursor, QueueFinished)}

    def queue_paused_list(self) -> list[PausedQueue]:
        with self._conn("reading paused queues failed") as conn:
            return _db.rows(conn.execute(self.q["queue_paused_list"]), PausedQueue)

    def queue_known_list(self) -> set[str]:
        """Every queue in use: with jobs that are not finished, or among the newest
        finished; served by a registered process; or paused. Cheap: a probe per queue."""
        with self._conn("reading the queues in use failed") as conn:
            return set(_db.scalars(conn.execute(self.q["queue_known_list"])))

    def queue_pause(self, queue: str, by: str | None = None) -> bool:
        """Pause `queue` everywhere, as by `by` (default: this user@host); False if it was
        paused already."""
        params = {"queue": checked_queue(queue), "by": by or operator()}
        with self._conn("pausing the queue failed") as conn:
            return conn.execute(self.q["queue_pause"], params).fetchone() is not None

    def queue_resume(self, queue: str) -> bool:
        """Resume `queue` and wake its workers; False if it was not paused."""
        params = {"queue": checked_queue(queue)}
        with self._conn("resuming the queue failed") as conn:
            return conn.execute(self.q["queue_resume"], params).fetchone() is not None

    def limit_list(self) -> list[LimitRow]:
        """Every limit in force: the queues' and the tasks', by scope and name."""
        with self._conn("reading the limits failed") as conn:
            return _db.rows(conn.execute(self.q["limit_list"]), LimitRow)

    def queue_limit_set(self, queue: str, change: LimitChange) -> LimitRow | None:
        """Set the limits `change` gives of `queue`, keep its others; what is in force now
        (None: no limit is left, and its row is gone, as queue_limit_clear leaves it).

        A `per` that changes resets the rate window, which is kept in hundredths of it."""
        params = change.params(checked_queue(queue))
        with self._conn("setting the queue's limits failed") as conn, conn.transaction():
            before = _db.one(conn.execute(self.q["queue_limit_lock"], params), QueueLimit)
            now = _db.one(conn.execute(self.q["queue_limit_set"], params), QueueLimit)
            assert now is not None  # an upsert returns its row
            if before is None or before.per != now.per:
                conn.execute(self.q["limit_window_reset"], {"id": now.id})
            if (now.concurrency, now.rate, now.max_depth) == (None, None, None):
                conn.execute(self.q["queue_limit_clear"], params)
                return None
        return LimitRow(
            "queue", queue, now.concurrency, now.rate, now.per, max_depth=now.max_depth,
            rejected=now.rejected,
        )  # fmt: skip

    def queue_limit_clear(self, queue: str) -> LimitRow | None:
        """Remove every limit of `queue`; what it had (None: it had none)."""
        params = {"queue": checked_queue(queue)}
        with self._conn("removing the queue's limits failed") as conn:
            return _db.one(conn.execute(self.q["queue_limit_clear"], params), LimitRow)

    def schedule_list(self) -> list[ScheduleRow]:
        """Every schedule the schedulers declared (`forklift schedules`), read with the
        scheduler's own query."""
        with self._conn("reading the schedules failed") as conn:
            return ScheduleSession(conn, self.sq).schedule_list()

    def process_list(self) -> list[ProcessRow]:
        with self._conn("reading the process registry failed") as conn:
            return _db.rows(conn.execute(self.q["process_list"]), ProcessRow)

    def ping(self) -> None:
        """Return if the database answers and has forklift's tables; else raise
        DatabaseError (SchemaMissing when it answers but was never migrated)."""
        with self._conn("database unreachable") as conn:
            jobs_table = _db.scalar(conn.execute(self.q["ping"]))
        if jobs_table is None:
            raise SchemaMissing(
                f'schema "{self.schema}" (forklift\'s tables) not found in '
                f"{_db.describe(self.dsn)}: run forklift migrate"
            )


def _limits_of(limit: LimitRow | None) -> dict[str, Any]:
    """QueueStats' limit fields of a queue's limits row (none: no limits)."""
    if limit is None:
        return {}
    return {
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "per": limit.per,
        "max_depth": limit.max_depth,
        "rejected": limit.rejected,
    }


def checked_queue(queue: str) -> str:
    """`queue` if it is a well-formed queue name; else ArgumentError saying why."""
    try:
        return _names.check("queue", queue)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
