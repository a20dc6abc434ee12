"""The operator's stores: queue statistics, paused queues, limits and the process list
(status, ps, queues, gauges) here; jobs (list, show, retry, cancel, purge) in `jobs.py`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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


class AdminStore:
    """Short, bounded connections; safe to call from the supervisor's ops thread."""

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
            rows = conn.execute(self.q["queue_depth"], {"cap": cap}).fetchall()
            minute = self._finished(conn, 60.0) if throughput else {}
            last_hour = self._finished(conn, 3600.0) if throughput and hour else {}
            paused = {r[0] for r in conn.execute(self.q["queue_paused_list"])}
            limits = {
                r.name: r
                for r in map(_limit_row, conn.execute(self.q["limit_list"]))
                if r.scope == "queue"
            }
        depth = {r[0]: (int(r[1]), int(r[2]), int(r[3]), int(r[4]), r[5]) for r in rows}
        names = sorted(
            set(depth) | set(minute) | set(last_hour) | set(include) | paused | set(limits)
        )
        return [
            QueueStats(
                q,
                *depth.get(q, (0, 0, 0, 0, None)),
                *minute.get(q, (0, 0)),
                *last_hour.get(q, (0, 0)),
                paused=q in paused,
                **_limits_of(limits.get(q)),
            )
            for q in names
        ]

    def _finished(self, conn: psycopg.Connection[Any], window: float) -> dict[str, tuple[int, int]]:
        rows = conn.execute(self.q["queue_finished"], {"window": window})
        return {r[0]: (int(r[1]), int(r[2])) for r in rows}

    def queue_paused_list(self) -> list[PausedQueue]:
        with self._conn("reading paused queues failed") as conn:
            return [PausedQueue(*r) for r in conn.execute(self.q["queue_paused_list"])]

    def queue_known_list(self) -> set[str]:
        """Every queue in use: with jobs that are not finished, or among the newest
        finished; served by a registered process; or paused. Cheap: a probe per queue."""
        with self._conn("reading the queues in use failed") as conn:
            return {r[0] for r in conn.execute(self.q["queue_known_list"])}

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
            return [_limit_row(r) for r in conn.execute(self.q["limit_list"])]

    def queue_limit_set(self, queue: str, change: LimitChange) -> LimitRow | None:
        """Set the limits `change` gives of `queue`, keep its others; what is in force now
        (None: no limit is left, and its row is gone, as queue_limit_clear leaves it).

        A `per` that changes resets the rate window, which is kept in hundredths of it."""
        params = change.params(checked_queue(queue))
        with self._conn("setting the queue's limits failed") as conn, conn.transaction():
            before = conn.execute(self.q["queue_limit_lock"], params).fetchone()
            row = conn.execute(self.q["queue_limit_set"], params).fetchone()
            assert row is not None  # an upsert returns its row
            limit_id, concurrency, rate, per, max_depth, rejected = row
            if before is None or before[3] != per:
                conn.execute(self.q["limit_window_reset"], {"id": limit_id})
            if (concurrency, rate, max_depth) == (None, None, None):
                conn.execute(self.q["queue_limit_clear"], params)
                return None
        return LimitRow(
            "queue", queue, concurrency, rate, per, max_depth=max_depth, rejected=rejected
        )

    def queue_limit_clear(self, queue: str) -> LimitRow | None:
        """Remove every limit of `queue`; what it had (None: it had none)."""
        params = {"queue": checked_queue(queue)}
        with self._conn("removing the queue's limits failed") as conn:
            row = conn.execute(self.q["queue_limit_clear"], params).fetchone()
        return None if row is None else _limit_row(row)

    def schedule_list(self) -> list[ScheduleRow]:
        """Every schedule the schedulers declared (`forklift schedules`), read with the
        scheduler's own query."""
        with self._conn("reading the schedules failed") as conn:
            return ScheduleSession(conn, self.sq).schedule_list()

    def process_list(self) -> list[ProcessRow]:
        with self._conn("reading the process registry failed") as conn:
            rows = conn.execute(self.q["process_list"]).fetchall()
        return [ProcessRow(*r) for r in rows]

    def ping(self) -> None:
        """Return if the database answers and has forklift's tables; else raise
        DatabaseError (SchemaMissing when it answers but was never migrated)."""
        with self._conn("database unreachable") as conn:
            row = conn.execute(self.q["ping"]).fetchone()
        if row is None or row[0] is None:
            raise SchemaMissing(
                f'schema "{self.schema}" (forklift\'s tables) not found in '
                f"{_db.describe(self.dsn)}: run forklift migrate"
            )


def _limit_row(row: Sequence[Any]) -> LimitRow:
    scope, name, concurrency, rate, per, keyed, key_arg, max_depth, rejected = row
    return LimitRow(scope, name, concurrency, rate, per, keyed, key_arg, max_depth, int(rejected))


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
