"""Planning a round: fire times ahead of now, and the misfire policy after downtime."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from forklift.scheduler.fire_times import Every
from forklift.scheduler.plan import plan

T0 = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
MINUTE = Every(60)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_fire_times_within_the_margin_are_enqueued_ahead() -> None:
    p = plan(Every(1), None, fired_through=at(0.5), now=at(0.5), ahead=3.0, limit=100)
    assert p.fires == (at(1), at(2), at(3))
    assert p.missed == 0
    assert p.through == at(3.5)


def test_nothing_due_is_an_empty_round_that_keeps_the_mark() -> None:
    p = plan(MINUTE, None, fired_through=at(10), now=at(10), ahead=3.0, limit=100)
    assert p.fires == ()
    assert p.through == at(13)
    # Another replica (a later round, or a longer --schedule-ahead) has handled further.
    assert plan(MINUTE, None, at(100), at(10), 3.0, 100).through == at(100)


def test_after_downtime_only_the_most_recent_missed_fire_time_runs() -> None:
    # Handled up to 12:00:30; down until 12:05:10: 12:01 ... 12:05 were missed.
    p = plan(MINUTE, None, fired_through=at(30), now=at(310), ahead=3.0, limit=100)
    assert p.fires == (at(300),)
    assert p.missed == 4  # 12:01 to 12:04, dropped
    assert p.through == at(313)


def test_with_catchup_every_missed_fire_time_in_the_window_runs() -> None:
    p = plan(MINUTE, 150.0, fired_through=at(30), now=at(310), ahead=3.0, limit=100)
    assert p.fires == (at(180), at(240), at(300))  # 12:03 to 12:05: within 150 s of now
    assert p.missed == 2  # 12:01 and 12:02: older than the window
    wide = plan(MINUTE, 3600.0, fired_through=at(30), now=at(310), ahead=3.0, limit=100)
    assert wide.fires == (at(60), at(120), at(180), at(240), at(300))
    assert wide.missed == 0


def test_a_long_catch_up_takes_several_rounds() -> None:
    first = plan(Every(1), 3600.0, fired_through=at(0), now=at(1000), ahead=3.0, limit=100)
    assert first.fires == tuple(at(s) for s in range(1, 101))
    assert first.through == at(100)  # the next round goes on from there
    second = plan(Every(1), 3600.0, first.through, now=at(1001), ahead=3.0, limit=100)
    assert second.fires[0] == at(101)


def test_a_round_with_nothing_missed_drops_nothing() -> None:
    # The previous round, at 12:00:00.2, handled up to 12:00:03.2; the next goes on.
    p = plan(Every(1), None, fired_through=at(3.2), now=at(0.7), ahead=3.0, limit=100)
    assert p.fires == ()
    p = plan(Every(1), None, fired_through=at(3.2), now=at(1.2), ahead=3.0, limit=100)
    assert p.fires == (at(4),)
    assert p.missed == 0
