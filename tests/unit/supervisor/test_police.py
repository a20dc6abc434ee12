"""The policing steps on constructed children, with a recorded kill and a fake clock."""

from __future__ import annotations

import signal

import pytest

from forklift.metrics import Totals
from forklift.supervisor.child import Children, Kill, RunningJob
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.deaths import Attribution
from forklift.supervisor.police import FIRST_REPORT_TIMEOUT, Police
from forklift.supervisor.states import KillReason
from tests.unit.supervisor.conftest import FakeStore, Signals, make_child

MiB = 2**20
TERM, KILL = signal.SIGTERM.value, signal.SIGKILL.value


def police(
    children: Children, store: FakeStore, rss: dict[int, int] | None = None, **config: object
) -> Police:
    cfg = SupervisorConfig(workers=1, kill_grace=3.0, **config)  # type: ignore[arg-type]
    sizes = rss or {}
    return Police(cfg, children, Attribution(store, Totals()), rss=lambda pid: sizes.get(pid, 0))


def test_an_overdue_job_has_its_child_killed_once_and_is_charged_only_at_its_reap(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    """Charged before the kill, the job was ready again (its limit's slot free) while
    its handler still ran for --kill-grace."""
    job = RunningJob(7, "render", started=100.0, timeout=1.0)
    child = make_child(children, 41, jobs={7: job})
    cop = police(children, store)
    cop.enforce_timeouts(now=100.5)
    assert signals.sent == [] and store.calls == []
    cop.enforce_timeouts(now=101.5)
    cause = "job render#7 timed out after 1 s"
    assert store.calls == []
    assert child.timed_out == {7: cause} and child.killing == Kill(KillReason.TIMEOUT, cause)
    assert signals.sent == [(41, TERM)] and child.kill_at == 101.5 + 3.0
    cop.enforce_timeouts(now=102.0)
    assert store.calls == [] and len(signals.sent) == 1


def test_a_timeout_the_database_missed_still_kills(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    child = make_child(children, 41, jobs={7: RunningJob(7, "render", 0.0, 1.0)})
    store.down = True
    police(children, store).enforce_timeouts(now=5.0)
    # Still a timeout (charged once it is dead), so the child's other jobs are bystanders.
    assert list(child.timed_out) == [7]
    assert child.killing is not None and signals.sent == [(41, TERM)]


def test_a_cancelled_job_past_the_cancel_grace_has_its_child_killed_at_once(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    job = RunningJob(7, "render", started=100.0, timeout=None, cancelled=101.0)
    child = make_child(children, 41, jobs={7: job})
    other = make_child(children, 42, jobs={8: RunningJob(8, "render", 100.0, None)})
    cop = police(children, store, cancel_grace=2.0)
    cop.enforce_cancels(now=102.9)
    assert signals.sent == []
    cop.enforce_cancels(now=103.0)
    cause = "job render#7 was cancelled and ran on past 2 s"
    assert child.killing == Kill(KillReason.CANCEL, cause) and other.killing is None
    assert signals.sent == [(41, KILL)] and store.calls == []  # cancelled already: no charge
    cop.enforce_cancels(now=104.0)
    assert len(signals.sent) == 1


def test_memory_past_the_hard_limit_kills_at_once(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    big, small = make_child(children, 41), make_child(children, 42)
    sizes = {41: 300 * MiB, 42: 200 * MiB}
    cop = police(children, store, sizes, max_memory_per_child=150.0, hard_memory_factor=1.5)
    cop.enforce_memory(now=10.0)
    assert signals.sent == [(41, KILL)]
    assert big.killing == Kill(
        KillReason.MEMORY, "memory limit: RSS 300 MiB passed 1.5 x the 150 MiB limit"
    )
    assert (big.peak_rss, small.peak_rss, small.killing) == (300 * MiB, 200 * MiB, None)
    cop.enforce_memory(now=11.0)
    assert len(signals.sent) == 1


def test_no_memory_limit_no_memory_policing(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    make_child(children, 41)
    police(children, store, {41: 10**12}).enforce_memory(now=1.0)
    assert signals.sent == []


def test_a_silent_child_is_killed_at_once(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    quiet = make_child(children, 41, started=0.0, reported=True)
    make_child(children, 42, started=25.0, reported=True)
    police(children, store, child_timeout=30.0).kill_unresponsive(now=31.0)
    assert signals.sent == [(41, KILL)]
    assert quiet.killing == Kill(KillReason.UNRESPONSIVE, "unresponsive: no report for 31 s")


def test_a_child_silent_since_its_fork_is_killed_long_before_the_child_timeout(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    # Wedged between its fork and its boot (its heartbeat never started): replaced
    # FIRST_REPORT_TIMEOUT after the fork. One that has reported gets child_timeout.
    wedged = make_child(children, 41, started=0.0)
    make_child(children, 42, started=0.0, reported=True)
    cop = police(children, store, child_timeout=30.0)
    cop.kill_unresponsive(now=FIRST_REPORT_TIMEOUT)
    assert signals.sent == []
    cop.kill_unresponsive(now=FIRST_REPORT_TIMEOUT + 0.5)
    assert signals.sent == [(41, KILL)]
    cause = "unresponsive: no report for 10 s since its fork (wedged before its boot)"
    assert wedged.killing == Kill(KillReason.UNRESPONSIVE, cause)


def test_a_child_timeout_shorter_than_the_first_report_timeout_holds_for_a_new_child(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    make_child(children, 41, started=0.0)
    police(children, store, child_timeout=2.0).kill_unresponsive(now=2.5)
    assert signals.sent == [(41, KILL)]


@pytest.mark.parametrize(("now", "sent"), [(9.9, []), (10.0, [(41, KILL)])])
def test_a_kill_escalates_to_sigkill_at_kill_at(
    children: Children, signals: Signals, store: FakeStore, now: float, sent: list[object]
) -> None:
    child = make_child(children, 41, kill_at=10.0)
    make_child(children, 42)
    police(children, store).escalate_kills(now)
    assert signals.sent == sent
    assert child.kill_at == (now + 1.0 if sent else 10.0)


def test_past_the_deadline_everything_left_gets_sigkill_each_second(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    make_child(children, 41)
    make_child(children, 42)
    cop = police(children, store)
    cop.enforce_deadline(now=100.0)  # no stop yet: no deadline
    cop.deadline = 50.0
    cop.enforce_deadline(now=49.0)
    assert signals.sent == []
    cop.enforce_deadline(now=50.0)
    assert signals.sent == [(41, KILL), (42, KILL)] and cop.deadline == 51.0


def test_a_kill_ends_the_childs_database_sessions_at_once(
    children: Children, signals: Signals, store: FakeStore
) -> None:
    make_child(children, 41)
    cop = police(children, store, child_timeout=5.0)
    cop.kill_unresponsive(now=10.0)
    assert signals.sent == [(41, KILL)]
    assert store.terminated == ["forklift-worker:41:abc"]  # not waiting for its exit
    store.down = True
    other = make_child(children, 42)
    cop.kill(other, KillReason.MEMORY, "memory", now=11.0)  # the database is away: still killed
    assert other.killing is not None and signals.sent[-1] == (42, TERM)
