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
from forklift.supervisor.running import RunningHandlers
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


def test_a_timed_out_childs_job_is_charged_once_it_is_dead_then_its_bystanders_released(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    cause = "job render#7 timed out after 1 s"
    parts = Parts(store, (41, SIGKILLED, 0))
    forked(
        parts.children,
        open_pipe,
        41,
        killing=Kill(KillReason.TIMEOUT, cause),
        timed_out={7: cause},
    )
    parts.reaper.reap(stopping=False)
    assert store.calls == [
        ("job_fail_orphaned", ("host:41:abc", f"TimeoutError: {cause}", [7])),
        ("job_release_owner", ("host:41:abc",)),
    ]
    assert store.crash_flags == [False]  # a timeout, no crash
    assert parts.totals.restarts == {"timeout": 1}
    assert parts.totals.jobs == {
        ("default", "render", "crashed"): 1,
        ("default", "render", "released"): 1,
    }


def test_a_death_charges_only_the_jobs_whose_handlers_ran_and_releases_the_rest(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    """The others it held (claimed ahead, or done and waiting for their group commit)
    did not kill it: before, each was charged a crash, and quarantined at the second."""
    parts = Parts(store, (41, EXIT_3, 0))
    handlers = RunningHandlers()
    handlers.began(7)
    handlers.began(8)
    handlers.returned(8)
    forked(parts.children, open_pipe, 41, handlers=handlers)
    parts.reaper.reap(stopping=False)
    (charge, (owner, _, ids)), release = store.calls
    assert (charge, owner, ids) == ("job_fail_orphaned", "host:41:abc", [7])
    assert release == ("job_release_owner", ("host:41:abc",))
    assert store.crash_flags == [True]


def test_a_death_with_no_handler_running_charges_nobody(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    parts = Parts(store, (41, EXIT_3, 0))
    forked(parts.children, open_pipe, 41, handlers=RunningHandlers())
    parts.reaper.reap(stopping=False)
    assert store.calls == [("job_release_owner", ("host:41:abc",))]


def test_a_native_crash_puts_its_stack_on_the_charge_and_its_group_is_killed(
    store: FakeStore, open_pipe: OpenPipe
) -> None:
    sent: list[tuple[int, int]] = []
    parts = Parts(store, (41, signal.SIGSEGV.value, 0), (42, 0, 0))
    parts.children = Children(send=lambda pid, signum: sent.append((pid, signum)))
    parts.reaper.children = parts.children
    log = os.memfd_create("crash-log")
    os.write(log, b'Fatal Python error: Segmentation fault\n\n  File "app.py", line 3 in f\n')
    forked(parts.children, open_pipe, 41, crash_log=log)
    forked(parts.children, open_pipe, 42)
    parts.reaper.reap(stopping=False)
    (_, (_, error, _)), *_ = store.calls
    assert error.startswith("WorkerDied: worker process killed by SIGSEGV")
    assert error.endswith('Fatal Python error: Segmentation fault\n\n  File "app.py", line 3 in f')
    assert sent == [(-41, signal.SIGKILL.value)]  # 42 exited cleanly: its group is left be


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
    assert len(parts.attribution.deferred) == 1
    store.down = False
    parts.attribution.retry_deferred(now=1e9)
    assert parts.attribution.deferred == []
    assert [name for name, _ in store.calls] == ["job_fail_orphaned"]
