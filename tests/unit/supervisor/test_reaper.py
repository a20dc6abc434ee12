"""Reaping without forking: a scripted wait4, children with real pipes, a fake store."""

from __future__ import annotations

import logging
import os
import resource
import signal
import time

import pytest

from forklift.metrics import Totals
from forklift.supervisor.child import Child, Children, Kill
from forklift.supervisor.deaths import Attribution
from forklift.supervisor.reaper import Reaper
from forklift.supervisor.reports import Reporter
from forklift.supervisor.restarts import RestartSchedule
from forklift.supervisor.states import KillReason, RetireReason
from forklift.supervisor.systemd import Notifier
from tests.unit.supervisor.conftest import FakeStore, OpenPipe

EXIT_3 = 3 << 8
SIGKILLED = signal.SIGKILL.value


def usage(max_rss_kib: int = 0) -> resource.struct_rusage:
    return resource.struct_rusage((0.0, 0.0, max_rss_kib, *[0] * 13))


class Exits:
    """A scripted os.wait4: the given exits, then 0 (nothing more), or ECHILD if none."""

    def __init__(self, *exits: tuple[int, int, int]) -> None:
        self.exits = list(exits)

    def __call__(self, pid: int, options: int) -> tuple[int, int, resource.struct_rusage]:
        assert (pid, options) == (-1, os.WNOHANG)
        if not self.exits:
            return 0, 0, usage()
        found, status, rss = self.exits.pop(0)
        if found < 0:
            raise ChildProcessError
        return found, status, usage(rss)


def forked(
    children: Children, open_pipe: OpenPipe, pid: int, **fields: object
) -> tuple[Child, int]:
    """A child with a real report pipe; returns it and the pipe's write end."""
    read_fd, write_fd = open_pipe()
    child = Child(pid, pid, f"host:{pid}:abc", read_fd, started=0.0, last_seen=0.0)
    for name, value in fields.items():
        setattr(child, name, value)
    children.add(child)
    return child, write_fd


class Parts:
    def __init__(self, store: FakeStore, *exits: tuple[int, int, int]) -> None:
        self.children = Children(send=lambda pid, signum: None)
        self.totals = Totals()
        self.attribution = Attribution(store, self.totals)
        self.restarts = RestartSchedule(Notifier())
        self.reaper = Reaper(
            self.children, self.attribution, self.totals, self.restarts, wait4=Exits(*exits)
        )


def test_a_crash_is_charged_before_anything_else_and_counted(
    store: FakeStore, open_pipe: OpenPipe, caplog: pytest.LogCaptureFixture
) -> None:
    parts = Parts(store, (41, SIGKILLED, 300 * 1024))
    _, write_fd = forked(parts.children, open_pipe, 41)
    Reporter(write_fd).start(7, None, "render")  # its last words, read on reap
    parts.reaper.reap(stopping=False)
    assert len(parts.children) == 0
    (name, (owner, error, ids)), *_ = store.calls
    assert (name, owner, ids) == ("job_fail_orphaned", "host:41:abc", None)
    assert error.startswith("WorkerDied: worker process killed by SIGKILL: possibly out of memory")
    assert error.endswith("(peak RSS 300 MiB)")
    assert parts.totals.restarts == {"crash": 1}
    assert parts.totals.jobs == {("default", "render", "crashed"): 1}
    assert parts.restarts.next_due(time.monotonic())  # a boot crash: its slot waits
    assert store.terminated == ["forklift-worker:41:abc"]  # its sessions end with it
    exited = [r for r in caplog.records if getattr(r, "event", "") == "child.exited"]
    assert [r.levelno for r in exited] == [logging.ERROR]


def test_every_exit_is_reaped_and_unknown_pids_are_skipped(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    parts = Parts(store, (41, 0, 0), (999, EXIT_3, 0), (42, EXIT_3, 0))
    forked(parts.children, open_pipe, 41)
    forked(parts.children, open_pipe, 42)
    forked(parts.children, open_pipe, 43)
    parts.reaper.reap(stopping=False)
    assert [c.pid for c in parts.children] == [43]
    assert [args[0] for _, args in store.calls] == ["host:42:abc"]  # 41 exited cleanly
    assert parts.totals.restarts == {"recycle": 1, "crash": 1}


def test_no_children_left_ends_the_reap(store: FakeStore) -> None:
    parts = Parts(store, (-1, 0, 0))
    parts.reaper.reap(stopping=False)
    assert store.calls == []


def test_a_timed_out_childs_bystanders_are_released(store: FakeStore, open_pipe: OpenPipe) -> None:
    parts = Parts(store, (41, SIGKILLED, 0))
    forked(
        parts.children,
        open_pipe,
        41,
        killing=Kill(KillReason.TIMEOUT, "job render#7 timed out after 1 s"),
        timed_out=[7],
    )
    parts.reaper.reap(stopping=False)
    assert store.calls == [("job_release_owner", ("host:41:abc",))]
    assert parts.totals.restarts == {"timeout": 1}
    assert parts.totals.jobs == {("default", "render", "released"): 1}


def test_a_shutdown_exit_is_neither_replaced_nor_counted(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    parts = Parts(store, (41, SIGKILLED, 0))
    forked(parts.children, open_pipe, 41, retiring=RetireReason.SHUTDOWN)
    parts.reaper.reap(stopping=True)
    assert store.calls == [("job_release_owner", ("host:41:abc",))]
    assert parts.totals.restarts == {}
    assert parts.restarts.next_due(time.monotonic()) is None


def test_a_death_the_database_missed_is_recorded_once_it_is_back(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    parts = Parts(store, (41, EXIT_3, 0))
    forked(parts.children, open_pipe, 41)
    store.down = True
    parts.reaper.reap(stopping=False)
    assert len(parts.attribution.pending) == 1
    store.down = False
    parts.attribution.retry_pending(now=1e9)
    assert parts.attribution.pending == []
    assert [name for name, _ in store.calls] == ["job_fail_orphaned"]
