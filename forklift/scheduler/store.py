"""The scheduler's store: the only caller of scheduler/queries.sql.

It runs on the supervisor's database thread, on the connection that thread holds; without
one, a round opens one short, bounded connection (`session()`) and closes it after.
psycopg errors come out as DatabaseError.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg

from forklift import _db, _sql
from forklift._conns import HeldConnection
from forklift.scheduler.schedule import Schedule
from forklift.store import _inserts, short_connection, translated


class Synced(NamedTuple):
    """A schedule's row after a sync: its high-water mark, and whether it was (re)defined."""

    fired_through: datetime
    redefined: bool


class Fired(NamedTuple):
    """What schedule_fire did: skipped for an unfinished earlier fire (overlap=False),
    the new job's id (None: not enqueued), and whether a job not of this schedule held
    its key (the fire's job then went in without one)."""

    busy: bool
    job_id: int | None
    key_taken: bool


class Locked(NamedTuple):
    """A schedule's row locked for a round of firing."""

    fired_through: datetime
    definition_hash: str
    now: datetime  # the locking transaction's start, on the database's clock


class Settled(NamedTuple):
    """What schedule_settle did: fires settled, schedules updated."""

    settled: int
    updated: int


@dataclass(frozen=True)
class ScheduleRow:
    """A schedule as `forklift schedules` and the metrics see it."""

    name: str
    task: str
    queue: str
    cron: str | None
    every_seconds: int | None
    tz: str
    catchup_seconds: float | None
    overlap: bool
    definition_hash: str
    created_at: datetime
    defined_at: datetime
    next_fire_at: datetime | None
    last_fire_at: datetime | None
    last_job_id: int | None
    last_success_at: datetime | None
    last_error: str | None
    last_error_at: datetime | None
    in_flight: int
    seen_ago: float  # seconds since a scheduler declaring it synced it


class ScheduleStore:
    def __init__(
        self, dsn: str, schema: str, timeouts: _db.Timeouts, held: HeldConnection | None = None
    ) -> None:
        self.dsn = dsn
        self.schema = schema
        self.timeouts = timeouts
        self.held = held  # the supervisor's database thread's connection, if any
        self.q = _sql.load("forklift.scheduler", "queries.sql", schema)

    @contextmanager
    def session(self, what: str = "scheduler round failed") -> Iterator[ScheduleSession]:
        """One connection for one round: the held one, or a short one closed after it."""
        if self.held is not None:
            with translated(what, _db.describe(self.dsn)), self.held.connection() as conn:
                yield ScheduleSession(conn, self.q)
            return
        with short_connection(self.dsn, self.timeouts, "forklift-scheduler", what) as conn:
            yield ScheduleSession(conn, self.q)

    def schedule_list(self) -> list[ScheduleRow]:
        with self.session("reading the schedules failed") as s:
            return s.schedule_list()


class ScheduleSession:
    """The scheduler's statements on one open connection (autocommit)."""

    def __init__(self, conn: psycopg.Connection[Any], q: dict[str, str]) -> None:
        self.conn = conn
        self.q = q

    def schedule_clock(self) -> datetime:
        """The database's clock: the `now` of a round."""
        now: datetime = _db.scalar(self.conn.execute(self.q["schedule_clock"]))
        return now

    def schedule_sync_many(self, schedules: Sequence[Schedule], now: datetime) -> dict[str, Synced]:
        params: dict[str, Any] = {
            "now": now,
            "name": [s.name for s in schedules],
            "task": [s.task for s in schedules],
            "queue": [s.queue for s in schedules],
            "cron": [s.cron for s in schedules],
            "every_seconds": [s.every for s in schedules],
            "tz": [s.tz for s in schedules],
            "catchup_seconds": [s.catchup for s in schedules],
            "overlap": [s.overlap for s in schedules],
            "definition_hash": [s.definition_hash for s in schedules],
            "next_fire_at": [s.times.after(now) for s in schedules],
        }
        rows = _db.rows(self.conn.execute(self.q["schedule_sync_many"], params), dict)
        return {r["name"]: Synced(r["fired_through"], bool(r["redefined"])) for r in rows}

    @contextmanager
    def schedule_lock(self, name: str) -> Iterator[Locked | None]:
        """A transaction holding the schedule's firing lock (None: another replica is
        firing it)."""
        with self.conn.transaction():
            taken = _db.scalar(self.conn.execute(self.q["schedule_fire_lock"], {"name": name}))
            locked = None
            if taken:
                cursor = self.conn.execute(self.q["schedule_lock"], {"name": name})
                locked = _db.one(cursor, Locked)
            yield locked

    def schedule_fire(self, schedule: Schedule, fire_at: datetime) -> Fired:
        """Enqueue `fire_at`'s job (see the query for when it does not)."""
        job = schedule.job_at(fire_at)
        params = {
            "name": schedule.name,
            "exclusive": not schedule.overlap,
            "fire_at": fire_at,
            "key": job.idempotency_key,
            **_inserts.values(job, _inserts.UNIQUE_FIELDS),
        }
        fired = _db.one(self.conn.execute(self.q["schedule_fire"], params), Fired)
        assert fired is not None
        return fired

    def schedule_advance(self, schedule: Schedule, through: datetime) -> None:
        params = {
            "name": schedule.name,
            "through": through,
            "definition_hash": schedule.definition_hash,
        }
        self.conn.execute(self.q["schedule_advance"], params)

    def schedule_settle(self, now: datetime) -> int:
        """Record finished fires on their schedules; return how many were settled."""
        settled = _db.one(self.conn.execute(self.q["schedule_settle"], {"now": now}), Settled)
        return 0 if settled is None else int(settled.settled)

    def schedule_list(self) -> list[ScheduleRow]:
        return _db.rows(self.conn.execute(self.q["schedule_list"]), ScheduleRow)
