"""Signal handlers that only queue: the supervisor loop reads the queue and acts."""

from __future__ import annotations

import os
import signal
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

HANDLED = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGQUIT,
    signal.SIGHUP,
    signal.SIGTTIN,
    signal.SIGTTOU,
    signal.SIGCHLD,
)


class SignalQueue:
    """Signals land in a deque and one byte in a self-pipe wakes the loop's select()."""

    def __init__(self) -> None:
        self.pending: deque[int] = deque()
        self.read_fd, self._write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self._write_fd, False)

    def install(self) -> None:
        for sig in HANDLED:
            signal.signal(sig, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGCHLD:  # SIGCHLD only wakes the loop; reaping is a step
            self.pending.append(signum)
        try:
            os.write(self._write_fd, b"\0")
        except OSError:
            pass

    def drain_pipe(self) -> None:
        try:
            while os.read(self.read_fd, 4096):
                pass
        except OSError:
            pass

    def pop(self) -> int | None:
        return self.pending.popleft() if self.pending else None

    @contextmanager
    def held(self) -> Iterator[None]:
        """Block the handled signals for the block; pending ones are delivered after."""
        previous = signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED)
        try:
            yield
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)

    def reset_in_child(self) -> None:
        """After fork: default dispositions, and close the parent's pipe."""
        for sig in HANDLED:
            signal.signal(sig, signal.SIG_DFL)
        for fd in (self.read_fd, self._write_fd):
            try:
                os.close(fd)
            except OSError:
                pass
