"""Keys from the terminal in cbreak mode, read without blocking the refresh; the terminal
is restored however the block ends (q, Ctrl-C, an error)."""

from __future__ import annotations

import os
import select
import termios
import time
import tty
from types import TracebackType
from typing import Any, TextIO


class Keys:
    """`with Keys(sys.stdin) as keys: keys.wait(1.0)` gives the keys pressed (or "")."""

    def __init__(self, stream: TextIO) -> None:
        self.fd = stream.fileno()
        self.tty = stream.isatty()
        self._saved: list[Any] | None = None

    def __enter__(self) -> Keys:
        if self.tty:
            self._saved = termios.tcgetattr(self.fd)
            # cbreak: keys arrive one at a time, unechoed; Ctrl-C still interrupts.
            tty.setcbreak(self.fd)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._saved is not None:
            termios.tcsetattr(self.fd, termios.TCSADRAIN, self._saved)
            self._saved = None

    def wait(self, timeout: float) -> str:
        """The keys pressed within `timeout` seconds ("" if none); without a terminal,
        just the wait."""
        if not self.tty:
            time.sleep(max(0.0, timeout))
            return ""
        ready, _, _ = select.select([self.fd], [], [], max(0.0, timeout))
        if not ready:
            return ""
        data = os.read(self.fd, 64)
        return data.decode("utf-8", "replace") if data else ""
