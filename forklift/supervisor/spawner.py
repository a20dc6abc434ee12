"""Forking one child: a fresh pipe and slot, signals held across the fork, and on the
child's side nothing of the parent's loop kept."""

from __future__ import annotations

import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import NoReturn

from forklift._events import emit
from forklift._ids import child_owner
from forklift.app import App
from forklift.metrics import Totals
from forklift.shared_tally import SharedTally
from forklift.shared_vouch import SharedVouch
from forklift.supervisor.boot import ChildSpec, child_main
from forklift.supervisor.child import Child, Children
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.running import RunningHandlers
from forklift.supervisor.session import HintFanout
from forklift.supervisor.signals import SignalQueue

log = logging.getLogger(__name__)


def own_process_group(pid: int = 0) -> None:
    """Put a child in a process group of its own (from both sides of the fork, so that
    neither can act before it is so): whatever its handlers start (subprocesses, their
    children) is in that group, and its supervisor kills the group when the child dies,
    so no external work of a dead worker runs on beside its job's retry."""
    try:
        os.setpgid(pid, 0)
    except (PermissionError, ProcessLookupError):
        pass  # the child got there first (and may have exec'd or exited): it is done


class Spawner:
    def __init__(
        self,
        config: SupervisorConfig,
        children: Children,
        signals: SignalQueue,
        fanout: HintFanout,
        *,
        totals: Totals,
        close_in_child: Callable[[], None],
        vouch: SharedVouch | None = None,
    ) -> None:
        self.config = config
        self.children = children
        self.signals = signals
        self.fanout = fanout  # where the session thread's hints reach the children
        self.supervisor_id = ""  # set by the supervisor's run(): children's owners name it
        self.totals = totals  # where the children's metric reports are summed
        self.close_in_child = close_in_child
        self.vouch = vouch  # whether the session's liveness lock vouches for the children

    def spawn(self, app: App, total: int, generation: int, index: int | None = None) -> Child:
        """Fork a child running `app` in slot `index` (default: the lowest free one); the
        parent's record of it."""
        index = index or self.children.free_index()
        nonce = secrets.token_hex(3)
        read_fd, write_fd = os.pipe()
        hint_read, hint_write = os.pipe()
        wake_fds = os.pipe()  # the child's claim-loop self-pipe; the parent writes news too
        parent_pid = os.getpid()
        # Signals are held back across the fork: one that reached the child before it
        # dropped the parent's handlers would be swallowed by them (a SIGTERM lost, a
        # child that never stops). Pending ones arrive once each side is ready.
        # A fork copies every lock as it is at that instant, held by threads the child
        # does not have. The parent's own are safe (held connections are abandoned in
        # the child, see _conns.py), but not every library's: under libfaketime a thread
        # waiting for the GIL holds its lock for a moment, and CPython's re-creation of
        # the GIL in the child then waits on it forever, before any Python code runs
        # there. So the first children are forked before the helper threads start (they
        # are busiest then: connecting, first rounds); a child of a later fork that
        # such a lock wedges never reports, and is replaced (Police.kill_unresponsive).
        counts = SharedTally()  # mapped before the fork: the child's counters, shared
        handlers = RunningHandlers()  # and which of its jobs' handlers run
        crash_log = os.memfd_create("forklift-crash-log", os.MFD_CLOEXEC)
        with self.signals.held():
            pid = os.fork()
            if pid == 0:  # the child: nothing of the parent's loop survives here
                self.signals.reset_in_child()
        if pid == 0:
            os.close(read_fd)
            os.close(hint_write)
            own_process_group()
            owner = child_owner(self.supervisor_id, os.getpid(), nonce)
            spec = ChildSpec(
                index, total, owner, write_fd, parent_pid, hint_read, counts, wake_fds,
                handlers, crash_log, self.vouch,
            )  # fmt: skip
            self._become_child(app, spec)
        own_process_group(pid)
        os.close(write_fd)
        os.close(hint_read)
        os.close(wake_fds[0])
        os.set_blocking(read_fd, False)
        self.fanout.add(hint_write, wake_fds[1])
        now = time.monotonic()
        child = Child(pid, index, child_owner(self.supervisor_id, pid, nonce), read_fd, now, now)
        child.on_close = lambda: self.fanout.remove(hint_write)
        child.generation = generation
        child.on_metrics = self.totals.add
        child.counts = counts
        child.handlers = handlers
        child.crash_log = crash_log
        child.on_malformed = self.totals.malformed
        child.idle_since = now
        self.children.add(child)
        emit(log, "child.started", pid=pid, index=index, owner=child.owner)
        return child

    def _become_child(self, app: App, spec: ChildSpec) -> NoReturn:
        for other in self.children:
            other.close_in_child()  # the other children's pipes are the parent's
        self.fanout.close_in_child()
        self.close_in_child()
        child_main(app, self.config, spec)
