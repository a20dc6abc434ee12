"""RestartPolicy: when a replacement child starts, and what a crash loop is."""

from __future__ import annotations

from forklift.supervisor.exits import RestartCount
from forklift.supervisor.restarts import RestartPolicy, RestartSchedule
from forklift.supervisor.systemd import Notifier


def test_a_crash_after_running_a_while_restarts_at_once() -> None:
    policy = RestartPolicy(fast_crash=5.0)
    assert policy.crashed(now=100.0, uptime=60.0) == 0.0
    assert policy.crashed(now=200.0, uptime=5.0) == 0.0  # exactly fast_crash is not fast
    assert not policy.in_crash_loop(200.0)


def test_consecutive_fast_crashes_double_the_delay_up_to_the_cap() -> None:
    policy = RestartPolicy(fast_crash=5.0, base=0.5, max_delay=30.0, window=1e9, loop_crashes=99)
    delays = [policy.crashed(now=float(t), uptime=1.0) for t in range(9)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_the_cap_applies_even_when_it_is_not_a_power_of_two_step() -> None:
    policy = RestartPolicy(base=0.5, max_delay=3.0)
    assert [policy.crashed(now=float(t), uptime=0.1) for t in range(5)] == [0.5, 1, 2, 3, 3]


def test_a_slow_crash_resets_the_streak() -> None:
    policy = RestartPolicy(fast_crash=5.0, base=0.5)
    assert [policy.crashed(now=float(t), uptime=1.0) for t in range(3)] == [0.5, 1.0, 2.0]
    assert policy.crashed(now=3.0, uptime=30.0) == 0.0
    assert policy.crashed(now=40.0, uptime=1.0) == 0.5


def test_healthy_resets_the_streak() -> None:
    policy = RestartPolicy(base=0.5)
    assert [policy.crashed(now=float(t), uptime=0.0) for t in range(4)] == [0.5, 1, 2, 4]
    policy.healthy()
    assert policy.crashed(now=10.0, uptime=0.0) == 0.5


def test_crash_loop_after_loop_crashes_fast_crashes_within_the_window() -> None:
    policy = RestartPolicy(fast_crash=5.0, loop_crashes=5, window=60.0)
    for t in (0.0, 10.0, 20.0, 30.0):
        policy.crashed(now=t, uptime=1.0)
        assert not policy.in_crash_loop(t)
    policy.crashed(now=40.0, uptime=1.0)
    assert policy.in_crash_loop(40.0)
    assert policy.in_crash_loop(60.0)  # the crash at 0 is exactly `window` old: still inside
    # The crash at 0 ages out: four left, no longer a loop, and it stays that way.
    assert not policy.in_crash_loop(60.5)
    assert not policy.in_crash_loop(1000.0)


def test_crashes_spread_wider_than_the_window_are_not_a_loop() -> None:
    policy = RestartPolicy(fast_crash=5.0, loop_crashes=5, window=60.0)
    for i in range(20):
        now = i * 16.0  # only four fit in any 60 s window
        policy.crashed(now=now, uptime=1.0)
        assert not policy.in_crash_loop(now)


def test_slow_crashes_never_make_a_crash_loop() -> None:
    policy = RestartPolicy(fast_crash=5.0, loop_crashes=5, window=60.0)
    for t in range(10):
        assert policy.crashed(now=float(t), uptime=6.0) == 0.0
    assert not policy.in_crash_loop(10.0)


# -- RestartSchedule ------------------------------------------------------------------------


def test_a_fast_crash_holds_back_the_replacement() -> None:
    schedule = RestartSchedule(Notifier())
    schedule.count(RestartCount.CRASH, now=100.0, uptime=1.0)
    assert schedule.restart_at == 100.5 and not schedule.crash_loop
    schedule.count(RestartCount.CRASH, now=100.5, uptime=0.1)
    assert schedule.restart_at == 101.5


def test_a_slow_crash_restarts_at_once() -> None:
    schedule = RestartSchedule(Notifier())
    schedule.count(RestartCount.CRASH, now=100.0, uptime=60.0)
    assert schedule.restart_at == 100.0


def test_five_fast_crashes_in_a_minute_are_a_crash_loop() -> None:
    schedule = RestartSchedule(Notifier())
    for t in range(5):
        assert not schedule.crash_loop
        schedule.count(RestartCount.CRASH, now=float(t), uptime=0.5)
    assert schedule.crash_loop
    schedule.count(RestartCount.CRASH, now=100.0, uptime=60.0)  # the window has passed
    assert not schedule.crash_loop


def test_a_long_clean_run_ends_the_streak_and_uncounted_exits_change_nothing() -> None:
    schedule = RestartSchedule(Notifier())
    schedule.count(RestartCount.CRASH, now=0.0, uptime=0.5)
    schedule.count(RestartCount.CRASH, now=1.0, uptime=0.5)
    schedule.count(RestartCount.NONE, now=2.0, uptime=0.5)
    schedule.count(RestartCount.CLEAN, now=3.0, uptime=1.0)  # too short to prove anything
    schedule.count(RestartCount.CRASH, now=4.0, uptime=0.5)
    assert schedule.restart_at == 4.0 + 2.0  # the third fast crash in a row
    schedule.count(RestartCount.CLEAN, now=10.0, uptime=30.0)
    schedule.count(RestartCount.CRASH, now=11.0, uptime=0.5)
    assert schedule.restart_at == 11.5
