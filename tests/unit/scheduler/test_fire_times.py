"""Fire-time computation: intervals aligned to the epoch, cron in a zone, DST both ways."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from forklift.scheduler.fire_times import Cron, Every, between

ZAGREB = ZoneInfo("Europe/Zagreb")


def utc(*parts: int) -> datetime:
    return datetime(*parts, tzinfo=UTC)  # type: ignore[arg-type,misc]


def fires(times: Cron | Every, start: datetime, end: datetime) -> list[datetime]:
    return between(times, start, end, 1000)


# -- intervals ---------------------------------------------------------------------------


def test_interval_fire_times_are_multiples_of_the_interval_since_the_epoch() -> None:
    five = Every(300)
    assert five.after(utc(2026, 1, 1, 0, 2, 17)) == utc(2026, 1, 1, 0, 5)
    assert five.after(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 10)  # strictly after
    assert five.latest(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 5)  # at or before
    assert five.latest(utc(2026, 1, 1, 0, 9, 59, 999999)) == utc(2026, 1, 1, 0, 5)


def test_every_replica_computes_the_same_interval_fire_times_wherever_it_starts() -> None:
    seven = Every(7)
    end = utc(2026, 1, 1, 0, 1)
    a = fires(seven, utc(2026, 1, 1), end)
    b = fires(seven, utc(2026, 1, 1, 0, 0, 3, 123456), end)
    assert b == [t for t in a if t > utc(2026, 1, 1, 0, 0, 3, 123456)]
    assert all(int(t.timestamp()) % 7 == 0 for t in a)


# -- cron --------------------------------------------------------------------------------


def test_cron_in_utc() -> None:
    nightly = Cron("0 3 * * *", ZoneInfo("UTC"))
    assert fires(nightly, utc(2026, 5, 1), utc(2026, 5, 3, 12)) == [
        utc(2026, 5, 1, 3),
        utc(2026, 5, 2, 3),
        utc(2026, 5, 3, 3),
    ]
    assert nightly.latest(utc(2026, 5, 2, 3)) == utc(2026, 5, 2, 3)
    assert nightly.latest(utc(2026, 5, 2, 2, 59, 59)) == utc(2026, 5, 1, 3)


def test_a_sixth_field_is_seconds_first() -> None:
    every_20s = Cron("*/20 * * * * *", ZoneInfo("UTC"))
    assert fires(every_20s, utc(2026, 1, 1), utc(2026, 1, 1, 0, 1)) == [
        utc(2026, 1, 1, 0, 0, 20),
        utc(2026, 1, 1, 0, 0, 40),
        utc(2026, 1, 1, 0, 1),
    ]


def test_cron_reads_local_time_in_its_zone() -> None:
    # Zagreb is UTC+1 in winter, UTC+2 in summer.
    nightly = Cron("0 3 * * *", ZAGREB)
    assert nightly.after(utc(2026, 1, 15)) == utc(2026, 1, 15, 2)
    assert nightly.after(utc(2026, 7, 15)) == utc(2026, 7, 15, 1)


# -- daylight saving time -----------------------------------------------------------------


def test_spring_forward_a_skipped_time_fires_once_at_the_end_of_the_gap() -> None:
    # 2026-03-29 in Zagreb: at 02:00 CET the clocks jump to 03:00 CEST; 02:00 never
    # happens. The 02:00 job fires once, at 03:00 CEST = 01:00 UTC.
    nightly = Cron("0 2 * * *", ZAGREB)
    assert fires(nightly, utc(2026, 3, 27, 12), utc(2026, 3, 30, 12)) == [
        utc(2026, 3, 28, 1),  # 02:00 CET (+01:00)
        utc(2026, 3, 29, 1),  # 03:00 CEST: the gap's end
        utc(2026, 3, 30, 0),  # 02:00 CEST (+02:00)
    ]
    assert nightly.latest(utc(2026, 3, 29, 1)) == utc(2026, 3, 29, 1)
    assert nightly.latest(utc(2026, 3, 29, 0, 59, 59)) == utc(2026, 3, 28, 1)


def test_fall_back_a_repeated_time_fires_once_at_its_first_occurrence() -> None:
    # 2026-10-25 in Zagreb: at 03:00 CEST the clocks go back to 02:00 CET; 02:00 happens
    # twice (00:00 and 01:00 UTC). The 02:00 job fires once, at the first: 00:00 UTC.
    nightly = Cron("0 2 * * *", ZAGREB)
    assert fires(nightly, utc(2026, 10, 23, 12), utc(2026, 10, 26, 12)) == [
        utc(2026, 10, 24, 0),  # 02:00 CEST (+02:00)
        utc(2026, 10, 25, 0),  # 02:00 CEST, the first 02:00; not again at 01:00 UTC
        utc(2026, 10, 26, 1),  # 02:00 CET (+01:00)
    ]


def test_in_the_repeated_hours_second_pass_its_fire_has_already_happened() -> None:
    half_past_two = Cron("30 2 * * *", ZAGREB)
    second_pass = utc(2026, 10, 25, 1, 5)  # 02:05 CET, after 02:30 CEST (00:30 UTC)
    assert half_past_two.latest(second_pass) == utc(2026, 10, 25, 0, 30)
    assert half_past_two.after(second_pass) == utc(2026, 10, 26, 1, 30)


def test_a_schedule_that_repeats_within_the_hour_keeps_real_time_through_a_change() -> None:
    half_hourly = Cron("*/30 * * * *", ZAGREB)
    fall_back = fires(half_hourly, utc(2026, 10, 24, 23, 45), utc(2026, 10, 25, 2))
    assert fall_back == [utc(2026, 10, 25, 0) + timedelta(minutes=30 * i) for i in range(5)]
    spring = fires(half_hourly, utc(2026, 3, 29, 0, 15), utc(2026, 3, 29, 2))
    assert spring == [utc(2026, 3, 29, 0, 30) + timedelta(minutes=30 * i) for i in range(4)]


@pytest.mark.parametrize("zone", ["America/New_York", "Australia/Lord_Howe", "Europe/Zagreb"])
def test_a_daily_time_fires_once_a_day_all_year(zone: str) -> None:
    daily = fires(Cron("30 2 * * *", ZoneInfo(zone)), utc(2026, 1, 1), utc(2027, 1, 1))
    days = [t.astimezone(ZoneInfo(zone)).date() for t in daily]
    assert len(days) == len(set(days)) in (364, 365)  # one per local day
