"""A self-pipe: any thread, or a signal handler, can wake the worker's main loop."""

from __future__ import annotations

import contextlib
import os
import select


class Wakeup:
    def __init__(self) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)

    def set(self) -> None:
        """Wake the waiter. Async-signal-safe: one non-blocking write."""
        try:
            os.write(self._w, b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full or closed: the waiter is awake already

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds; return True if woken. Consumes the wake-ups."""
        ready, _, _ = select.select([self._r], [], [], max(0.0, timeout))
        if ready:
            self.clear()
        return bool(ready)

    def clear(self) -> None:
        try:
            while os.read(self._r, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    def close(self) -> None:
        for fd in (self._r, self._w):
            with contextlib.suppress(OSError):
                os.close(fd)
