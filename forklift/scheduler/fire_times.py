"""Fire times: when a cron expression or an interval fires, as UTC instants, DST-correct.

Cron expressions are parsed and walked by cronsim; this module only decides how local
wall-clock times become instants. An expression with a fixed minute and hour (`0 2 * *
*`) is read on the wall clock, as Debian cron does: a time the clocks skip fires once at
the end of the gap, a time that happens twice fires once, at its first occurrence. An
expression that repeats within the hour (`*/15 * * * *`) follows real time instead, so
it keeps its rhythm through a change. Intervals (`every=`) are multiples of their length
since the Unix epoch, so every replica computes the same instants with no shared state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Protocol
from zoneinfo import ZoneInfo

from forklift.errors import ConfigError

SECOND = timedelta(seconds=1)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_SHIFT = timedelta(hours=3)  # more than any clock change a time zone has made


def _cronsim(expr: str, start: datetime, *, reverse: bool = False) -> Iterator[datetime]:
    """cronsim's walk from `start` (imported here, not at start-up: most apps have no
    cron schedule, and the CLI none)."""
    from cronsim import CronSim

    return CronSim(expr, start, reverse=reverse)


class FireTimes(Protocol):
    """The instants a schedule fires at; every method takes and returns aware datetimes."""

    def after(self, t: datetime) -> datetime | None:
        """The first fire time strictly after `t` (None: it never fires again)."""
        ...

    def latest(self, t: datetime) -> datetime | None:
        """The last fire time at or before `t` (None: none since long before)."""
        ...


def between(times: FireTimes, start: datetime, end: datetime, limit: int) -> list[datetime]:
    """Fire times in (start, end], in order, at most `limit` of them."""
    found: list[datetime] = []
    t = times.after(start)
    while t is not None and t <= end and len(found) < limit:
        found.append(t)
        t = times.after(t)
    return found


class Every:
    """Every `seconds` whole seconds, aligned to the Unix epoch (UTC)."""

    def __init__(self, seconds: int) -> None:
        self.seconds = seconds

    def after(self, t: datetime) -> datetime | None:
        n = math.floor((t - EPOCH) / timedelta(seconds=self.seconds)) + 1
        return EPOCH + timedelta(seconds=n * self.seconds)

    def latest(self, t: datetime) -> datetime | None:
        n = math.floor((t - EPOCH) / timedelta(seconds=self.seconds))
        return EPOCH + timedelta(seconds=n * self.seconds)


class Cron:
    """A cron expression (5 fields, or 6 with seconds first) in a time zone."""

    def __init__(self, expr: str, zone: ZoneInfo) -> None:
        self.expr = " ".join(expr.split())
        self.zone = zone
        fields = self.expr.split(" ")
        minute, hour = fields[-5], fields[-4]
        # A fixed time of day is read on the wall clock (see the module docstring).
        self.wall_clock = (
            zone.key != "UTC" and not minute.startswith("*") and not hour.startswith("*")
        )
        from cronsim import CronSimError  # an app's first cron schedule imports it

        try:
            _cronsim(self.expr, datetime.now(UTC))
        except CronSimError as exc:
            raise ConfigError(f"cron expression {expr!r}: {exc}") from None

    def after(self, t: datetime) -> datetime | None:
        return next(self._walk(t, reverse=False), None)

    def latest(self, t: datetime) -> datetime | None:
        # Walking back from one second past `t`, truncated, yields times <= t.
        start = t.replace(microsecond=0) + SECOND
        return next(self._walk(start, reverse=True), None)

    def _walk(self, t: datetime, *, reverse: bool) -> Iterator[datetime]:
        """Fire times strictly after (or, reversed, before) `t`, as UTC instants."""
        # cronsim ends its iteration after 50 years without a match.
        t = t.replace(microsecond=0)
        if not self.wall_clock:
            for local in _cronsim(self.expr, t.astimezone(self.zone), reverse=reverse):
                yield local.astimezone(UTC)
            return
        # Wall times map to instants in order (a repeated hour's to its first pass), but
        # in a repeated hour's second pass, later wall times than now's have passed
        # already: a backward walk starts past any clock change and skips what is ahead.
        wall = t.astimezone(self.zone).replace(tzinfo=None)
        if reverse:
            wall += MAX_SHIFT
        for naive in _cronsim(self.expr, wall, reverse=reverse):
            instant = self._instant(naive)
            if (instant < t) if reverse else (instant > t):
                yield instant

    def _instant(self, naive: datetime) -> datetime:
        """A wall-clock time as an instant: its first occurrence, or the gap's end."""
        local = naive.replace(tzinfo=self.zone, fold=0)
        while _skipped(local):
            naive += timedelta(minutes=1)
            local = naive.replace(tzinfo=self.zone, fold=0)
        return local.astimezone(UTC)


def _skipped(local: datetime) -> bool:
    """True for a wall-clock time that does not exist (the clocks jumped over it)."""
    return local.astimezone(UTC).astimezone(local.tzinfo).replace(tzinfo=None) != local.replace(
        tzinfo=None
    )
