"""The fork server: the one process that forks workers. The supervisor forks it before any
thread of its own starts, and it never starts one: so the process that forks has one
thread, every time. (A fork copies every lock as it is at that instant, held in the
child by threads it does not have; Python 3.12 warns on os.fork() in a process with more
than one thread.)

Why a fork server, and not a sidecar that owns the supervisor's threads: what would
have to cross a process boundary. The database, session, HTTP and maintenance threads
share with the loop, every tick, what a sidecar would have to be sent or send back:
each child's metric reports (summed for /metrics), the snapshot behind the probes and
the registry, every death to charge (with the dead child's shared-memory marks, which
the loop reads), the group commits a dead child left unanswered, the backlog that
autoscale reads, the boot check's verdict, the schedules a reload swaps, and the
session's hints, which it writes straight into each child's pipes (a sidecar would be
handed their descriptors, one child at a time). A fork server needs one request per
fork (a slot and the child's descriptors) and one answer (its pid); everything else
stays where it is.

The workers stay the supervisor's own children: the supervisor is a child subreaper
(PR_SET_CHILD_SUBREAPER), and the fork server forks each worker from a middle process
that exits at once, so the kernel hands the orphan to the supervisor. It waits for it
(wait4), signals it and its process group, restarts its slot, reads its shared memory
and charges or releases its jobs as ever. What the supervisor shares with a worker is
made by the supervisor and handed over with the request: pipes, and memory as memfds
that both map.

The fork server lives as long as the supervisor's end of their socket: at its EOF it
exits. It keeps the supervisor's signals blocked (a Ctrl-C to the process group is the
supervisor's to act on); a worker sets them to their defaults and unblocks them before
anything else. A reload imports the app again here too, so that the next workers run
the new code. A fork server that dies (the OOM killer) could be replaced only by a fork
of the threaded supervisor: the supervisor stops instead, its workers finishing their
jobs.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import select
import signal
import socket
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import NoReturn

from setproctitle import setproctitle

from forklift.errors import ForkliftError
from forklift.supervisor.exits import signal_name
from forklift.supervisor.signals import HANDLED, SignalQueue

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
MAX_FDS = 16  # descriptors one request hands over at most
ANSWER_WITHIN = 30.0  # seconds a request may wait for its answer: past them, it is lost

_LIBC = ctypes.CDLL(None, use_errno=True)
_FORK = ctypes.PyDLL(None, use_errno=True).fork  # called with the GIL held

# A file the test suite names: each fork appends the forking process's pid and number of
# threads to it, as it forks.
FORK_LOG = "FORKLIFT_TEST_FORK_LOG"


def _told_to_the_fork_log() -> None:
    path = os.environ.get(FORK_LOG)
    if path:
        line = f"{os.getpid()} {threading.active_count()}\n".encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)


def fork_worker() -> int:
    """os.fork(): the app's fork hooks (os.register_at_fork) run, in the new worker."""
    _told_to_the_fork_log()
    return os.fork()


def fork_plain() -> int:
    """fork(2) without the interpreter's fork hooks, for the fork server and the middle
    process: they run none of the app's code, and an app's hooks are for its workers (a
    hook that exits or blocks must end the worker, not the fork server). Only from a
    process with one thread (the GIL held throughout, as os.fork() holds it): what the
    interpreter redoes after a fork is for the locks and states of other threads. An
    app that started threads of its own as it was imported gets os.fork(), hooks and
    all."""
    _told_to_the_fork_log()
    if threading.active_count() > 1:
        return os.fork()
    pid: int = _FORK()
    if pid < 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"fork: {os.strerror(errno)}")
    return pid


def become_subreaper() -> None:
    """Be the parent of every orphan among this process's descendants."""
    if _LIBC.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_CHILD_SUBREAPER): {os.strerror(errno)}")


def own_process_group(pid: int = 0) -> None:
    """Put a worker in a process group of its own (from both sides of its fork, so that
    neither can act before it is so): whatever its handlers start (subprocesses, their
    children) is in that group, and its supervisor kills the group when the worker dies,
    so no external work of a dead worker runs on beside its job's retry."""
    try:
        os.setpgid(pid, 0)
    except (PermissionError, ProcessLookupError):
        pass  # the worker got there first (and may have exec'd or exited): it is done


class ForkServerLost(ForkliftError):
    """The fork server is gone or does not answer: no worker can be forked any more."""


@dataclass(frozen=True)
class Order:
    """A worker to fork: its slot, the size of the pool, its owner id's nonce."""

    index: int
    total: int
    nonce: str


# Runs in the new worker: the order, the descriptors handed over with it, and the pid of
# the middle process that forked it. Never returns.
BecomeWorker = Callable[[Order, list[int], int], NoReturn]


class ForkServer:
    """The supervisor's end: `start()` forks the server (before any thread starts);
    `fork()` asks it for a worker, `reload()` to import the app again; `stop()`."""

    def __init__(self, signals: SignalQueue) -> None:
        self.signals = signals
        self.pid = 0
        self._sock: socket.socket | None = None

    def start(
        self,
        title: str,
        become_worker: BecomeWorker,
        reload: Callable[[], bool],
        close_in_child: Callable[[], None],
    ) -> None:
        become_subreaper()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        # Signals are held across the fork, and stay blocked in the server for good.
        with self.signals.held():
            pid = fork_plain()
            if pid == 0:
                setproctitle(title)
                ours.close()
                self.signals.reset_in_child()
                close_in_child()
                _serve(theirs, become_worker, reload)
        theirs.close()
        ours.settimeout(ANSWER_WITHIN)
        self.pid, self._sock = pid, ours

    def fork(self, order: Order, fds: Sequence[int]) -> int:
        """The pid of a new worker for `order`, handed `fds`: the supervisor's child."""
        pid = self._ask(asdict(order), fds).get("pid", 0)
        if not isinstance(pid, int) or pid <= 0:
            raise OSError(f"the fork server could not fork worker {order.index}")
        return pid

    def reload(self) -> bool:
        """Import the app again in the server; whether it imported."""
        return self._ask({"reload": True}).get("reloaded") is True

    def _ask(self, request: dict[str, object], fds: Sequence[int] = ()) -> dict[str, object]:
        if self._sock is None:
            raise ForkServerLost("the fork server is not running")
        try:
            socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
            answer = self._sock.recv(4096)
        except OSError as exc:  # a timeout among them: a server that does not answer
            raise ForkServerLost(f"the fork server is lost: {exc}{self._end()}") from exc
        if not answer:
            raise ForkServerLost(f"the fork server is lost{self._end()}")
        decoded: dict[str, object] = json.loads(answer)
        return decoded

    def _end(self) -> str:
        """How the server ended, if it has (and was not reaped yet): for the error."""
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                return f" (pid {self.pid})"
            if pid != 0:
                if os.WIFSIGNALED(status):
                    return f" (pid {self.pid}, killed by {signal_name(os.WTERMSIG(status))})"
                return f" (pid {self.pid}, exited with code {os.waitstatus_to_exitcode(status)})"
            _pause(0.01)
        return f" (pid {self.pid}, still running)"

    def stop(self) -> None:
        """Close the server's socket (it exits at the EOF) and reap it."""
        if self._sock is None:
            return
        self._sock.close()
        self._sock = None
        try:
            os.waitpid(self.pid, 0)  # it exits at once: it only ever waits on that socket
        except ChildProcessError:
            pass  # reaped already, by the supervisor's reaper


def _serve(
    sock: socket.socket, become_worker: BecomeWorker, reload: Callable[[], bool]
) -> NoReturn:
    """The server's loop: one request at a time, until the supervisor's end closes."""
    code = 0
    try:
        while True:
            data, fds, _, _ = socket.recv_fds(sock, 4096, MAX_FDS, socket.MSG_CMSG_CLOEXEC)
            if not data:
                break  # the supervisor is gone
            request = json.loads(data)
            answer: dict[str, object]
            try:
                if request.get("reload"):
                    answer = {"reloaded": reload()}
                else:
                    answer = {"pid": _fork_worker(sock, Order(**request), fds, become_worker)}
            finally:
                for fd in fds:
                    os.close(fd)
            sock.send(json.dumps(answer).encode())
    except BaseException:
        traceback.print_exc()
        code = 1
    os._exit(code)


def _fork_worker(
    sock: socket.socket, order: Order, fds: list[int], become_worker: BecomeWorker
) -> int:
    """Fork a worker from a middle process that exits at once: its pid (0 if it failed)."""
    read_fd, write_fd = os.pipe()
    middle = fork_plain()
    if middle == 0:
        code = 1
        try:
            os.close(read_fd)
            me = os.getpid()
            pid = fork_worker()
            if pid == 0:
                os.close(write_fd)
                sock.close()
                become_worker(order, fds, me)
            own_process_group(pid)
            os.write(write_fd, str(pid).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    os.waitpid(middle, 0)
    # The worker may hold the write end a while (its fork hooks run before it closes
    # it): what the middle wrote is read without waiting for the pipe's end.
    os.set_blocking(read_fd, False)
    try:
        text = os.read(read_fd, 64)
    except BlockingIOError:
        text = b""  # the middle died before it could say
    finally:
        os.close(read_fd)
    return int(text) if text.isdigit() else 0


def in_worker(middle: int) -> None:
    """A new worker's first steps: its signals at their defaults and unblocked (one that
    came meanwhile is acted on now), its own process group, and its supervisor for a
    parent (the middle process it was forked from exits at once)."""
    for sig in HANDLED:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, HANDLED)
    own_process_group()
    while os.getppid() == middle:
        _pause(0.001)


def _pause(seconds: float) -> None:
    # select(), not time.sleep(): under libfaketime (the tests of a skewed clock)
    # time.sleep() fails with EINVAL.
    select.select([], [], [], seconds)
