"""The snapshot the loop publishes for the ops thread."""

from __future__ import annotations

import dataclasses

import pytest

from forklift.supervisor.child import Children, Kill, RunningJob
from forklift.supervisor.snapshot import Identity, Snapshot, SnapshotBoard, take_snapshot
from forklift.supervisor.states import KillReason, RetireReason
from tests.unit.supervisor.conftest import make_child

ME = Identity("host:100:sup", "host", 100, "default,mail", started=10.0)


def test_counts_and_readiness(children: Children) -> None:
    make_child(children, 1, jobs={7: RunningJob(7, "render", 0.0, None)})
    make_child(children, 2)
    make_child(children, 3, retiring=RetireReason.RELOAD)
    make_child(children, 4, killing=Kill(KillReason.MEMORY, "too big"))
    snap = take_snapshot(ME, children, stopping=False, crash_loop=False, now=20.0)
    assert (snap.live_workers, snap.busy, snap.idle) == (2, 1, 3)
    assert snap.ready and snap.last_tick == 20.0 and snap.supervisor_id == ME.id
    assert not take_snapshot(ME, children, stopping=True, crash_loop=False, now=20.0).ready
    assert not take_snapshot(ME, children, stopping=False, crash_loop=True, now=20.0).ready
    assert not take_snapshot(ME, Children(), stopping=False, crash_loop=False, now=20.0).ready


def test_registry_rows_the_supervisor_first_then_its_workers(children: Children) -> None:
    make_child(children, 1, started=12.0, rss=4096, jobs={7: RunningJob(7, "render", 0.0, None)})
    make_child(children, 2, started=15.0)
    rows = take_snapshot(ME, children, stopping=False, crash_loop=False, now=20.0).registry_rows
    sup, busy, idle = rows
    assert (sup.id, sup.kind, sup.pid, sup.supervisor_id) == (ME.id, "supervisor", 100, None)
    assert sup.uptime == 10.0 and sup.queues == "default,mail"
    assert (busy.id, busy.kind, busy.supervisor_id) == ("host:1:abc", "worker", ME.id)
    assert (busy.current_job, busy.rss_bytes, busy.uptime) == (7, 4096, 8.0)
    assert (idle.current_job, idle.rss_bytes) == (None, None)  # no heartbeat yet


def test_a_snapshot_is_frozen_and_the_board_hands_out_the_latest() -> None:
    first = Snapshot(last_tick=1.0)
    board = SnapshotBoard(first)
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.stopping = True  # type: ignore[misc]
    second = dataclasses.replace(first, last_tick=2.0)
    board.publish(second)
    assert board.read() is second
