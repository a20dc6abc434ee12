"""The scheduler: every supervisor runs one; together they fire each fire time once.

No leader: each round every replica syncs its schedule definitions into the schedules
table, then for each schedule with fire times due (or due within `ahead` seconds) it
locks that schedule's row (SKIP LOCKED: a replica already on it is left to it),
re-plans from the row's high-water mark, and enqueues each fire time's job under a key
made of the schedule's name and the fire time. A replica that lost a race, or a round
that is repeated after a crash, inserts nothing. Last, it settles finished fires into
each schedule's last success and last error.

Every decision of a round is made on the database's clock, read once at its start (the
host's may be minutes off), and a job's due time is its fire time on that clock, which
is also the clock workers claim by: a replica with a wrong clock neither skips, doubles
nor delays a fire.

overlap=False is decided when a fire is due, not when it could be enqueued ahead: while
an earlier fire's job is unfinished, a later fire is not enqueued ahead (the round stops
that schedule just before it and plans it again next round); once its time has come,
it is skipped if that job is still unfinished, else enqueued. So two jobs of such a
schedule never run at once, and a fire whose predecessor finished in time still starts
on time (it is enqueued ahead in the first round after the predecessor finished, or at
the latest in the first round past its time).
"""

from __future__ import annotations

import enum
import logging
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from forklift._events import emit
from forklift._service import TestSignal
from forklift.errors import DatabaseError
from forklift.scheduler.config import SchedulerConfig
from forklift.scheduler.plan import Plan, plan
from forklift.scheduler.schedule import Schedule
from forklift.scheduler.store import Fired, ScheduleSession, ScheduleStore, Synced

log = logging.getLogger(__name__)
JUST_BEFORE = timedelta(microseconds=1)  # fire times are whole seconds


class FireOutcome(enum.StrEnum):
    """What became of one fire time on this replica (forklift_cron_fires_total)."""

    ENQUEUED = "enqueued"
    DUPLICATE = "duplicate"  # another replica had enqueued it
    SKIPPED_OVERLAP = "skipped_overlap"
    SKIPPED_MISFIRE = "skipped_misfire"  # missed in downtime, dropped by the policy
    FAILED = "failed"  # the database refused or was away


@dataclass(frozen=True)
class Fire:
    schedule: str
    at: datetime | None  # None for a count of misfires
    outcome: FireOutcome
    job_id: int | None = None
    count: int = 1


@dataclass(frozen=True)
class Round:
    """What one round did: the fires it handled, and how many finished fires it settled."""

    fires: tuple[Fire, ...] = ()
    settled: int = 0

    def outcomes(self, schedule: str) -> dict[FireOutcome, int]:
        counts: dict[FireOutcome, int] = {}
        for f in self.fires:
            if f.schedule == schedule:
                counts[f.outcome] = counts.get(f.outcome, 0) + f.count
        return counts


class Scheduler:
    """One replica's scheduler; `run_once(now)` is a round (the supervisor runs one every
    tick among its database services, on their connection: it holds it while it runs)."""

    def __init__(
        self,
        store: ScheduleStore,
        schedules: Iterable[Schedule],
        config: SchedulerConfig | None = None,
    ) -> None:
        self.store = store
        self.config = config or SchedulerConfig()
        self.schedules = tuple(schedules)
        self.counts: dict[tuple[str, FireOutcome], int] = {}
        self._lock = threading.Lock()
        self.ran: TestSignal[Round] = TestSignal()  # each finished round, for tests

    def use(self, schedules: Iterable[Schedule]) -> None:
        """Fire these from the next round on (after a reload re-imported the app)."""
        self.schedules = tuple(schedules)

    def run_once(self, now: datetime | None = None) -> Round:
        """One round at `now` (default: the database's clock); DatabaseError if it failed."""
        schedules = self.schedules
        if not schedules:
            return Round()
        fires: list[Fire] = []
        told = now is not None  # a test's clock: plan by it alone
        with self.store.session() as session:
            now = now or session.schedule_clock()
            synced = session.schedule_sync_many(schedules, now)
            for schedule in schedules:
                fires += self._fire(session, schedule, synced[schedule.name], now, told)
            settled = session.schedule_settle(now)
        result = Round(tuple(fires), settled)
        self.ran.emit(result)
        return result

    def _fire(
        self,
        session: ScheduleSession,
        schedule: Schedule,
        synced: Synced,
        now: datetime,
        told: bool = False,
    ) -> list[Fire]:
        if synced.redefined:
            emit(log, "schedule.defined", schedule=schedule.name, definition=schedule.describe())
        first = self._plan(schedule, synced.fired_through, now)
        if not first.fires and not first.missed:
            return []  # nothing due: no lock, no write
        try:
            with session.schedule_lock(schedule.name) as row:
                if row is None or row.definition_hash != schedule.definition_hash:
                    return []  # another replica is on it, or runs another definition
                # Planned from the moment of enqueueing (the lock's transaction), not the
                # round's start: a fire due in between would otherwise go in after its time.
                at = now if told else max(now, row.now)
                todo = self._plan(schedule, row.fired_through, at)
                fires, through = self._enqueue(session, schedule, todo, at)
                session.schedule_advance(schedule, through)
        except DatabaseError as exc:
            self._count([Fire(schedule.name, None, FireOutcome.FAILED)])
            emit(log, "schedule.failed", logging.WARNING, schedule=schedule.name, error=exc)
            raise
        if todo.missed:
            emit(log, "schedule.missed", logging.WARNING, schedule=schedule.name, n=todo.missed)
            fires.append(Fire(schedule.name, None, FireOutcome.SKIPPED_MISFIRE, count=todo.missed))
        self._count(fires)  # now: a later schedule's failure must not lose these
        return fires

    def _plan(self, schedule: Schedule, fired_through: datetime, now: datetime) -> Plan:
        cfg = self.config
        return plan(schedule.times, schedule.catchup, fired_through, now, cfg.ahead, cfg.max_fires)

    @staticmethod
    def _enqueue(
        session: ScheduleSession, schedule: Schedule, todo: Plan, now: datetime
    ) -> tuple[list[Fire], datetime]:
        """Enqueue the plan's fire times; (what became of each, handled through when)."""
        fires: list[Fire] = []
        for at in todo.fires:
            fired = session.schedule_fire(schedule, at)
            if fired.busy and at > now:
                # overlap=False: the earlier job may yet finish in time; decide at `at`.
                return fires, at - JUST_BEFORE
            fires.append(_outcome(schedule, at, fired))
        return fires, todo.through

    def _count(self, fires: Iterable[Fire]) -> None:
        with self._lock:
            for f in fires:
                key = (f.schedule, f.outcome)
                self.counts[key] = self.counts.get(key, 0) + f.count

    def counted(self) -> dict[tuple[str, FireOutcome], int]:
        """The fires counted so far, by (schedule, outcome) (for /metrics)."""
        with self._lock:
            return dict(self.counts)


def _outcome(schedule: Schedule, at: datetime, fired: Fired) -> Fire:
    if fired.key_taken:
        emit(
            log, "schedule.key_taken", logging.WARNING, schedule=schedule.name,
            fire=at.isoformat(), key=schedule.key(at),
        )  # fmt: skip
    if fired.busy:
        emit(log, "schedule.skipped_overlap", schedule=schedule.name, fire=at.isoformat())
        return Fire(schedule.name, at, FireOutcome.SKIPPED_OVERLAP)
    if fired.job_id is None:
        return Fire(schedule.name, at, FireOutcome.DUPLICATE)
    emit(
        log, "schedule.enqueued", logging.DEBUG, schedule=schedule.name, job=fired.job_id,
        fire=at.isoformat(),
    )  # fmt: skip
    return Fire(schedule.name, at, FireOutcome.ENQUEUED, fired.job_id)
