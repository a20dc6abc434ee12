"""A self-pipe: any thread, or a signal handler, can wake the worker's main loop."""

from __future__ import annotations

import contextlib
import os
import select
import time

# What a wake-up says: look (news), or only that a job's slot freed.
NEWS = b"\0"
SLOT = b"s"


class Wakeup:
    """`fds`: the (read, write) ends of a pipe made before a fork, whose write end the
    parent keeps too (a supervisor wakes its child's claim loop with NEWS directly);
    else a pipe of its own."""

    def __init__(self, fds: tuple[int, int] | None = None) -> None:
        self._r, self._w = fds if fds is not None else os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def set(self, what: bytes = NEWS) -> None:
        """Wake the waiter. Async-signal-safe: one non-blocking write."""
        try:
            os.write(self._w, what)
        except (BlockingIOError, OSError):
            pass  # the pipe is full or closed: the waiter is awake already

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; return True if woken. Consumes the wake-ups."""
        ready, _, _ = select.select([self._r], [], [], max(0.0, timeout))
        if ready:
            self.clear()
        return bool(ready)

    def wait_for_news(self, timeout: float) -> bool:
        """Like wait(), but wake-ups that only say slots freed (`set(SLOT)`) do not end
        it: to a loop whose last claim found the queue drained, a freed slot is no
        reason to claim (a new job notifies); claiming anyway, it was mid-claim, blind
        to the job whose notification came then, as often as not."""
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            ready, _, _ = select.select([self._r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                return False
            if self._drain().replace(SLOT, b""):
                return True

    def clear(self) -> None:
        self._drain()

    def _drain(self) -> bytes:
        """Consume the wake-ups; what they said."""
        said = b""
        try:
            while chunk := os.read(self._r, 4096):
                said += chunk
        except (BlockingIOError, OSError):
            pass
        return said

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
