"""Which fire times one scheduler round enqueues: the upcoming ones, and the missed ones
its misfire policy keeps. Pure: no clock, no database."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from forklift.scheduler.fire_times import FireTimes, between

MISSED_COUNTED = 1000  # missed fire times are counted up to this many per round


@dataclass(frozen=True)
class Plan:
    """Fire times to enqueue (in order), how many missed ones the policy drops (counted
    up to MISSED_COUNTED), and the new high-water mark: every fire time up to `through`
    is then handled."""

    fires: tuple[datetime, ...]
    missed: int
    through: datetime


def plan(
    times: FireTimes,
    catchup: float | None,
    fired_through: datetime,
    now: datetime,
    ahead: float,
    limit: int,
) -> Plan:
    """The round at `now` for a schedule handled up to `fired_through`.

    Fire times up to `ahead` seconds from now are enqueued now (their jobs wait until
    their time), so each job is ready at its fire time, not a round after it. Fire
    times that passed unhandled (downtime) are misfires: with `catchup` seconds, those
    within that window before now are enqueued too; without, only the most recent one.
    At most `limit` fire times per round; the rest wait for the next round.
    """
    horizon = now + timedelta(seconds=ahead)
    if fired_through >= horizon:
        return Plan((), 0, fired_through)
    if catchup is None:
        fires = []
        latest = times.latest(now)
        if latest is not None and latest > fired_through:
            fires.append(latest)
            missed = _count(times, fired_through, latest) - 1
        else:
            missed = 0
        fires += between(times, max(fired_through, now), horizon, limit)
    else:
        start = max(fired_through, now - timedelta(seconds=catchup))
        missed = _count(times, fired_through, start)
        fires = between(times, start, horizon, limit)
    if len(fires) >= limit:
        fires = fires[:limit]
        return Plan(tuple(fires), missed, fires[-1])
    return Plan(tuple(fires), missed, horizon)


def _count(times: FireTimes, start: datetime, end: datetime) -> int:
    """Fire times in (start, end], counted up to MISSED_COUNTED."""
    return len(between(times, start, end, MISSED_COUNTED)) if end > start else 0
