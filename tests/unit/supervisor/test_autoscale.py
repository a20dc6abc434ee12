"""Autoscaler: +1 / 0 / -1 children by backlog and idleness, with hysteresis."""

from __future__ import annotations

import pytest

from forklift.supervisor.autoscale import Autoscaler


def test_scales_up_by_one_when_there_is_a_backlog_and_every_child_is_busy() -> None:
    scaler = Autoscaler(1, 5, up_cooldown=2.0)
    assert scaler.decide(100.0, current=2, backlog=10, busy=2, longest_idle=0.0) == 1


def test_does_not_scale_up_while_some_child_is_idle() -> None:
    scaler = Autoscaler(1, 5)
    assert scaler.decide(100.0, current=2, backlog=10, busy=1, longest_idle=1.0) == 0


def test_does_not_scale_up_again_within_the_up_cooldown() -> None:
    scaler = Autoscaler(1, 5, up_cooldown=2.0)
    assert scaler.decide(100.0, current=1, backlog=10, busy=1, longest_idle=0.0) == 1
    assert scaler.decide(101.0, current=2, backlog=10, busy=2, longest_idle=0.0) == 0
    assert scaler.decide(101.9, current=2, backlog=10, busy=2, longest_idle=0.0) == 0
    assert scaler.decide(102.0, current=2, backlog=10, busy=2, longest_idle=0.0) == 1


def test_never_scales_above_the_maximum() -> None:
    scaler = Autoscaler(1, 3, up_cooldown=2.0)
    for t in range(0, 100, 2):
        assert scaler.decide(float(t), current=3, backlog=1000, busy=3, longest_idle=0.0) == 0


def test_scales_down_when_idle_long_enough_and_only_after_the_down_cooldown() -> None:
    scaler = Autoscaler(1, 5, down_cooldown=10.0, idle_for=15.0)
    assert scaler.decide(100.0, current=3, backlog=0, busy=0, longest_idle=14.9) == 0
    assert scaler.decide(100.0, current=3, backlog=0, busy=0, longest_idle=15.0) == -1
    assert scaler.decide(105.0, current=2, backlog=0, busy=0, longest_idle=40.0) == 0
    assert scaler.decide(109.9, current=2, backlog=0, busy=0, longest_idle=40.0) == 0
    assert scaler.decide(110.0, current=2, backlog=0, busy=0, longest_idle=40.0) == -1


def test_a_scale_up_also_starts_the_down_cooldown() -> None:
    scaler = Autoscaler(1, 5, up_cooldown=2.0, down_cooldown=10.0, idle_for=15.0)
    assert scaler.decide(100.0, current=2, backlog=5, busy=2, longest_idle=0.0) == 1
    assert scaler.decide(105.0, current=3, backlog=0, busy=0, longest_idle=20.0) == 0
    assert scaler.decide(110.0, current=3, backlog=0, busy=0, longest_idle=20.0) == -1


def test_does_not_scale_down_while_there_is_a_backlog() -> None:
    scaler = Autoscaler(1, 5)
    assert scaler.decide(100.0, current=3, backlog=1, busy=2, longest_idle=1000.0) == 0


def test_never_scales_below_the_minimum() -> None:
    scaler = Autoscaler(2, 5, down_cooldown=10.0, idle_for=15.0)
    for t in range(0, 200, 2):
        assert scaler.decide(float(t), current=2, backlog=0, busy=0, longest_idle=1e6) == 0


def test_below_the_minimum_adds_and_above_the_maximum_removes_regardless_of_cooldowns() -> None:
    scaler = Autoscaler(2, 4, up_cooldown=2.0, down_cooldown=10.0)
    assert scaler.decide(100.0, current=3, backlog=5, busy=3, longest_idle=0.0) == 1  # cooldown
    assert scaler.decide(100.1, current=1, backlog=0, busy=0, longest_idle=100.0) == 1
    assert scaler.decide(100.2, current=0, backlog=0, busy=0, longest_idle=0.0) == 1
    assert scaler.decide(100.3, current=5, backlog=100, busy=5, longest_idle=0.0) == -1
    assert scaler.decide(100.4, current=9, backlog=0, busy=0, longest_idle=0.0) == -1


def test_a_queue_that_refills_within_idle_for_never_scales_down() -> None:
    # Bursts every 12 s: 4 s of backlog (every child busy), then 8 s idle, which is less
    # than idle_for. The count climbs to the maximum and stays there: no flapping.
    scaler = Autoscaler(1, 4, up_cooldown=2.0, down_cooldown=10.0, idle_for=15.0)
    current = 1
    idle_since: float | None = None
    history = []
    for step in range(100):
        now = step * 2.0
        bursting = now % 12.0 < 4.0
        if bursting:
            idle_since = None
            backlog, busy = 50, current
        else:
            idle_since = now if idle_since is None else idle_since
            backlog, busy = 0, 0
        longest_idle = 0.0 if idle_since is None else now - idle_since
        delta = scaler.decide(now, current, backlog, busy, longest_idle)
        assert delta >= 0, f"scaled down at {now} s after {longest_idle} s idle"
        current += delta
        history.append(current)
    assert history == sorted(history)
    assert history[-1] == 4


def test_a_queue_that_stays_empty_scales_down_step_by_step_to_the_minimum() -> None:
    scaler = Autoscaler(1, 4, down_cooldown=10.0, idle_for=15.0)
    current, changes = 4, []
    for step in range(200):
        now = step * 2.0  # idle since 0
        delta = scaler.decide(now, current, backlog=0, busy=0, longest_idle=now)
        if delta:
            changes.append((now, delta))
        current += delta
    assert current == 1
    assert changes == [(16.0, -1), (26.0, -1), (36.0, -1)]


@pytest.mark.parametrize(("low", "high"), [(0, 3), (3, 2), (-1, -1), (0, 0), (2, 1)])
def test_autoscaler_rejects_invalid_bounds(low: int, high: int) -> None:
    with pytest.raises(ValueError, match="MIN <= MAX"):
        Autoscaler(low, high)


def test_autoscaler_accepts_equal_bounds() -> None:
    scaler = Autoscaler(2, 2)
    assert scaler.decide(100.0, current=2, backlog=100, busy=2, longest_idle=0.0) == 0
    assert scaler.decide(200.0, current=2, backlog=0, busy=0, longest_idle=1e6) == 0
