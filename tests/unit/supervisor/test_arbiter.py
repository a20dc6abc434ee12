"""The supervisor's own loop steps, called one by one: no fork, no real signals."""

from __future__ import annotations

import itertools
import os
import signal
import time
from collections.abc import Iterator

import pytest

import forklift
from forklift.supervisor import Supervisor, SupervisorConfig
from forklift.supervisor.child import Child
from forklift.supervisor.exits import RestartCount
from forklift.supervisor.spawner import Spawner
from forklift.supervisor.states import KillReason, RetireReason, StopMode
from forklift.workers.config import WorkerConfig
from tests.unit.supervisor.conftest import Signals

TERM, QUIT = signal.SIGTERM.value, signal.SIGQUIT.value


class FakeSpawner(Spawner):
    """Records a child instead of forking one."""

    def __init__(self, sup: Supervisor) -> None:
        super().__init__(
            sup.config,
            sup.children,
            sup.signals,
            sup.fanout,
            totals=sup.totals,
            close_in_child=sup.ops.close_in_child,
        )
        self.pids = itertools.count(1000)

    def spawn(self, total: int, generation: int, index: int | None = None) -> Child:
        pid, now = next(self.pids), time.monotonic()
        child = Child(pid, index or self.children.free_index(), f"host:{pid}:x", -1, now, now)
        child.generation = generation
        self.children.add(child)
        return child


def stop_mode(sup: Supervisor) -> StopMode | None:
    return sup.stopping  # read afresh (mypy narrows sup.stopping across the steps)


@pytest.fixture
def sup(signals: Signals, monkeypatch: pytest.MonkeyPatch) -> Iterator[Supervisor]:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    config = SupervisorConfig(workers=2, worker=WorkerConfig(grace=10.0), kill_grace=2.0)
    supervisor = Supervisor(forklift.App("postgresql://unused"), config, send=signals)
    supervisor.spawner = FakeSpawner(supervisor)
    yield supervisor
    os.close(supervisor.signals.read_fd)
    os.close(supervisor.signals._write_fd)


def test_maintain_count_starts_the_target_and_retires_the_newest_extra(
    sup: Supervisor, signals: Signals
) -> None:
    sup.maintain_count()
    first, second = sup.children
    assert [c.index for c in (first, second)] == [1, 2]
    sup.handle_sigttou()
    sup.maintain_count()
    assert second.retiring is RetireReason.SCALE_DOWN and first.retiring is None
    assert signals.sent == [(second.pid, TERM)]
    assert sup.children.live() == [first]


def test_no_child_starts_in_a_slot_during_its_restart_backoff(sup: Supervisor) -> None:
    for slot in (1, 2):
        sup.restarts.count(RestartCount.BOOT_CRASH, slot, time.monotonic())
    sup.maintain_count()
    assert len(sup.children) == 0
    wait = sup.restarts.next_due(time.monotonic())
    assert wait is not None and 0 < wait <= 0.5


def test_sigterm_stops_gracefully_and_a_second_sigint_hurries_it(
    sup: Supervisor, signals: Signals
) -> None:
    sup.maintain_count()
    pids = [c.pid for c in sup.children]
    sup.signals.pending.append(signal.SIGTERM)
    sup.dispatch_signals()
    assert sup.stopping is StopMode.GRACEFUL
    assert signals.sent == [(pid, TERM) for pid in pids]
    assert all(c.retiring is RetireReason.SHUTDOWN for c in sup.children)
    assert sup.police.deadline == pytest.approx(time.monotonic() + 10.0 + 2.0, abs=1.0)
    sup.signals.pending.extend([signal.SIGTERM, signal.SIGINT])  # TERM again: no change
    sup.dispatch_signals()
    assert stop_mode(sup) is StopMode.FAST
    assert signals.sent[2:] == [(pid, QUIT) for pid in pids]
    assert sup.police.deadline == pytest.approx(time.monotonic() + 2.0, abs=1.0)
    sup.maintain_count()  # stopping: nothing starts
    assert len(sup.children) == 2


def test_the_first_sigint_is_graceful(sup: Supervisor) -> None:
    sup.handle_sigint()
    assert sup.stopping is StopMode.GRACEFUL


def test_a_reload_rolls_one_child_at_a_time(sup: Supervisor, signals: Signals) -> None:
    sup.maintain_count()
    old = list(sup.children)
    sup.handle_sighup()  # no app target: the same code, a new generation
    sup.roll_reload()
    assert old[0].retiring is RetireReason.RELOAD and old[1].retiring is None
    sup.roll_reload()  # one at a time
    assert old[1].retiring is None
    sup.maintain_count()  # the retiring one no longer counts: its replacement starts
    fresh = [c for c in sup.children.live() if c.generation == 1]
    assert len(fresh) == 1
    sup.children.pop(old[0].pid)  # reaped
    sup.roll_reload()
    assert old[1].retiring is RetireReason.RELOAD
    assert [pid for pid, _ in signals.sent] == [old[0].pid, old[1].pid]


def test_publish_gives_the_ops_thread_a_copy(sup: Supervisor) -> None:
    before = sup.board.read()
    assert not before.ready
    sup.maintain_count()
    sup.publish()
    snapshot = sup.board.read()
    assert snapshot.ready and snapshot.live_workers == 2 and snapshot.idle == 2
    assert len(snapshot.registry_rows) == 3
    sup.stop(fast=False)
    assert sup.board.read().ready  # until the next publish
    sup.publish()
    assert not sup.board.read().ready and sup.board.read().stopping


def test_the_title_says_what_the_supervisor_is_doing(
    sup: Supervisor, monkeypatch: pytest.MonkeyPatch
) -> None:
    shown: list[str] = []
    monkeypatch.setattr("forklift.supervisor.arbiter.setproctitle", shown.append)
    sup.maintain_count()
    sup.update_title()
    sup.restarts.crash_loop = True
    sup.update_title()
    sup.stop(fast=True)
    sup.update_title()
    assert [t.split(": ", 1)[1] for t in shown] == [
        "running, 2/2 workers, 0 busy",
        "crash loop, 2/2 workers, 0 busy",
        "fast, 2/2 workers, 0 busy",
    ]


SIGKILL_STATUS = signal.SIGKILL.value  # a wait status: killed by that signal


def reap(sup: Supervisor, child: Child, status: int = SIGKILL_STATUS) -> None:
    """What the loop's reap step does once `child` has exited with `status`."""
    sup.children.pop(child.pid)
    sup.reaper.on_exit(child, status, 0, stopping=False, now=time.monotonic())


def test_a_worker_killed_after_booting_is_replaced_at_once_however_young(
    sup: Supervisor,
) -> None:
    # One external SIGKILL a second: each death is of a worker that had booted (its loop
    # ran), so none is a boot crash; no backoff, no crash loop, never short of workers.
    sup.maintain_count()
    for _ in range(8):
        victim = next(iter(sup.children))
        victim.booted = True
        reap(sup, victim)
        sup.maintain_count()
        assert len(sup.children.live()) == 2
    assert not sup.restarts.crash_loop
    assert sup.totals.restarts == {"crash": 8}


def test_a_boot_crash_backs_off_its_own_slot_only(sup: Supervisor) -> None:
    sup.maintain_count()
    first, second = sorted(sup.children, key=lambda c: c.index)
    reap(sup, first)  # died before its worker loop ran: a boot crash
    sup.maintain_count()
    assert [c.index for c in sup.children] == [2]  # slot 1 waits out its backoff
    second.booted = True
    reap(sup, second)  # a running worker killed meanwhile: its slot refills at once
    sup.maintain_count()
    assert [c.index for c in sup.children] == [2]
    assert len(sup.children.live()) == 1


def test_a_replacement_takes_the_slot_of_the_child_being_killed(sup: Supervisor) -> None:
    sup.maintain_count()
    first, second = sup.children
    sup.police.kill(second, KillReason.TIMEOUT, "job x#1 timed out after 1 s", time.monotonic())
    sup.maintain_count()  # the killed child is still alive, on its way out
    replacement = next(c for c in sup.children if c not in (first, second))
    assert replacement.index == second.index == 2  # `worker 2/2`, never `worker 3/2`
