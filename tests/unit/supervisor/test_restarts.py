"""RestartSchedule: per slot, when its next child starts; overall, what a crash loop is."""

from __future__ import annotations

import time

from forklift.supervisor.child import Child
from forklift.supervisor.exits import RestartCount
from forklift.supervisor.restarts import RestartPolicy, RestartSchedule
from forklift.supervisor.systemd import Notifier

BOOT_CRASH, BOOTED, NONE = RestartCount.BOOT_CRASH, RestartCount.BOOTED, RestartCount.NONE


def schedule(**policy: float) -> RestartSchedule:
    return RestartSchedule(Notifier(), RestartPolicy(**policy))  # type: ignore[arg-type]


def booted_child(started: float) -> Child:
    child = Child(1, 1, "h:1:a", -1, started, started)
    child.booted = True
    return child


def test_boot_crashes_in_a_row_double_a_slots_delay_up_to_the_cap() -> None:
    s = schedule(base=0.5, max_delay=30.0, window=1e9, loop_crashes=99)
    waits = []
    for t in range(9):
        s.count(BOOT_CRASH, 1, float(t))
        waits.append(s.next_due(float(t)))
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_the_cap_applies_even_when_it_is_not_a_power_of_two_step() -> None:
    s = schedule(base=0.5, max_delay=3.0)
    waits = []
    for t in range(5):
        s.count(BOOT_CRASH, 1, t * 100.0)
        waits.append(s.next_due(t * 100.0))
    assert waits == [0.5, 1, 2, 3, 3]


def test_each_slot_backs_off_on_its_own() -> None:
    s = schedule(base=0.5)
    s.count(BOOT_CRASH, 1, 100.0)
    s.count(BOOT_CRASH, 1, 100.5)  # slot 1: the second in a row, 1 s
    assert not s.due(1, 101.0) and s.due(1, 101.5)
    assert s.due(2, 100.6)  # slot 2 never crashed: it starts at once
    s.count(BOOT_CRASH, 2, 101.0)
    assert not s.due(2, 101.2) and s.due(2, 101.5)  # its own first delay, 0.5 s


def test_a_death_after_boot_ends_the_slots_streak_and_waits_for_nothing() -> None:
    s = schedule(base=0.5)
    for t in (0.0, 1.0, 3.0):
        s.count(BOOT_CRASH, 1, t)
    s.count(BOOTED, 1, 4.0)  # its next child booted, then died (killed from outside)
    assert s.due(1, 4.0) and s.next_due(4.0) is None
    s.count(BOOT_CRASH, 1, 5.0)
    assert s.next_due(5.0) == 0.5  # a fresh streak


def test_uncounted_exits_change_nothing() -> None:
    s = schedule(base=0.5)
    s.count(BOOT_CRASH, 1, 0.0)
    s.count(NONE, 1, 0.1)
    assert s.next_due(0.1) == 0.4


def test_five_boot_crashes_in_a_minute_are_a_crash_loop_until_they_age_out() -> None:
    s = schedule(loop_crashes=5, window=60.0)
    for t, slot in zip((0.0, 10.0, 20.0, 30.0, 40.0), (1, 2, 1, 2, 1), strict=True):
        assert not s.crash_loop
        s.count(BOOT_CRASH, slot, t)
    assert s.crash_loop
    s.review(60.0, [])  # the crash at 0 is exactly `window` old: still inside
    assert s.crash_loop
    s.review(60.5, [])
    assert not s.crash_loop


def test_a_crash_loop_ends_when_a_child_started_after_it_boots() -> None:
    s = schedule(loop_crashes=3, window=60.0)
    for t in (1.0, 2.0, 3.0):
        s.count(BOOT_CRASH, 1, t)
    s.review(4.0, [booted_child(started=0.5)])  # booted before the crashes: no news
    assert s.crash_loop
    s.review(5.0, [booted_child(started=3.5)])
    assert not s.crash_loop


def test_deaths_after_boot_never_make_a_crash_loop() -> None:
    s = schedule(loop_crashes=5, window=60.0)
    for t in range(30):  # one external SIGKILL a second
        s.count(BOOTED, 1 + t % 2, float(t))
        assert s.due(1, float(t)) and s.due(2, float(t))
    assert not s.crash_loop


def test_the_schedule_runs_on_the_monotonic_clock() -> None:
    s = schedule()
    now = time.monotonic()
    s.count(BOOT_CRASH, 3, now)
    assert not s.due(3, time.monotonic())
