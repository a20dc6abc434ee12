"""Starting one worker: a fresh slot and owner id, its pipes and its shared memory made
here and handed to the fork server (forkserver.py), which forks it; the supervisor's
record of it. And what the new worker does with what it was handed."""

from __future__ import annotations

import functools
import gc
import logging
import os
import secrets
import time
from collections.abc import Callable
from typing import NoReturn

from setproctitle import setproctitle

from forklift import shared_tally
from forklift._events import emit
from forklift._ids import child_owner
from forklift.app import App
from forklift.metrics import Totals
from forklift.shared_tally import SharedTally
from forklift.shared_vouch import SharedVouch
from forklift.supervisor import running
from forklift.supervisor.boot import ChildSpec, child_main
from forklift.supervisor.child import Child, Children
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.forkserver import ForkServer, ForkServerLost, Order, in_worker
from forklift.supervisor.running import RunningHandlers
from forklift.supervisor.session import HintFanout
from forklift.supervisor.signals import SignalQueue
from forklift.supervisor.title import ChildTitle

log = logging.getLogger(__name__)


def shared_memory(name: str, size: int) -> int:
    """A memfd of `size` zero bytes: memory the supervisor and a worker both map."""
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


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
        self.server = ForkServer(signals)
        # The fork server's own: the app its workers run, and how to import it again.
        self._app: App | None = None
        self._reimport: Callable[[], App] | None = None
        self._parent_pid = 0

    def start(self, app: App, target: str | None, reimport: Callable[[str], App] | None) -> None:
        """Fork the fork server, before any thread of the supervisor starts: it runs `app`
        and, on a reload, imports `target` again with `reimport`."""
        self._app, self._parent_pid = app, os.getpid()
        if target and reimport is not None:
            self._reimport = functools.partial(reimport, target)
        queues = ",".join(self.config.worker.queues)
        self.server.start(
            f"forklift fork server [{queues}]", self._become_worker, self._reload,
            self.close_in_child,
        )  # fmt: skip

    def reload(self) -> bool:
        """Whether the fork server imported the app again (its next workers run it)."""
        if self._reimport is None:
            return True
        try:
            return self.server.reload()
        except ForkServerLost as exc:  # the next spawn stops the supervisor
            log.error("reload: %s", exc)
            return False

    def stop(self) -> None:
        self.server.stop()

    def spawn(self, total: int, generation: int, index: int | None = None) -> Child:
        """Start a worker in slot `index` (default: the lowest free one); the
        supervisor's record of it. ForkServerLost if the fork server is gone."""
        index = index or self.children.free_index()
        nonce = secrets.token_hex(3)
        read_fd, write_fd = os.pipe()
        hint_read, hint_write = os.pipe()
        wake_fds = os.pipe()  # the child's claim-loop self-pipe; the parent writes news too
        counts_fd = shared_memory("forklift-counts", shared_tally.SIZE)
        handlers_fd = shared_memory("forklift-running", running.SIZE)
        crash_log = os.memfd_create("forklift-crash-log", os.MFD_CLOEXEC)
        counts = SharedTally(counts_fd)  # the child's counters, shared
        handlers = RunningHandlers(handlers_fd)  # and which of its jobs' handlers run
        handed = [write_fd, hint_read, *wake_fds, counts_fd, handlers_fd, crash_log]
        try:
            pid = self.server.fork(Order(index, total, nonce), handed)
        except BaseException:
            for fd in (read_fd, hint_write, wake_fds[1], crash_log):
                os.close(fd)
            counts.close()
            handlers.close()
            raise
        finally:  # the worker's own ends, and the memory the mappings hold
            for fd in (write_fd, hint_read, wake_fds[0], counts_fd, handlers_fd):
                os.close(fd)
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

    # -- in the fork server ----------------------------------------------------------------

    def _reload(self) -> bool:
        assert self._reimport is not None
        try:
            self._app = self._reimport()
        except Exception:
            log.exception("reload: the fork server could not import the app again")
            return False
        gc.collect()
        gc.freeze()  # what the next workers share with the fork server, copy-on-write
        return True

    def _become_worker(self, order: Order, fds: list[int], middle: int) -> NoReturn:
        in_worker(middle)
        report_fd, hint_fd, wake_read, wake_write, counts_fd, handlers_fd, crash_log = fds
        counts, handlers = SharedTally(counts_fd), RunningHandlers(handlers_fd)
        os.close(counts_fd)  # each mapping holds its own
        os.close(handlers_fd)
        queues = self.config.worker.queues
        setproctitle(ChildTitle(order.index, order.total, queues).prefix)
        owner = child_owner(self.supervisor_id, os.getpid(), order.nonce)
        spec = ChildSpec(
            order.index, order.total, owner, report_fd, self._parent_pid, hint_fd, counts,
            (wake_read, wake_write), handlers, crash_log, self.vouch,
        )  # fmt: skip
        assert self._app is not None
        child_main(self._app, self.config, spec)
