"""Ctrl-C and SIGTERM for the demo: one exception, raised once, never mid-cleanup.

The demo is a one-shot command, not a daemon, so a signal may interrupt whatever it is
waiting on. But starting a server or stopping the supervisor must not be cut in half
(that is how things are left running), so those run shielded: a signal that arrives
then is raised when the shielded section ends. Signals after the first are ignored:
the cleanup they would ask for is already under way.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(Exception):
    """The demo was interrupted by a signal."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Interrupts:
    """Installs the handlers on enter, restores the previous ones on exit."""

    def __init__(self) -> None:
        self.signum = 0
        self._raised = False
        self._depth = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> Interrupts:
        for signum in SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum:
            return
        self.signum = signum
        if not self._depth:
            self._raise()

    def _raise(self) -> None:
        self._raised = True
        raise Interrupted(self.signum)

    @contextmanager
    def shielded(self) -> Iterator[None]:
        """Run the block to its end; raise a signal that arrived meanwhile after it."""
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
        if self.signum and not self._raised and not self._depth:
            self._raise()

    def shield(self, fn: Callable[[], object]) -> Callable[[], None]:
        """`fn` as a cleanup callback that a signal cannot cut short."""

        def run() -> None:
            with self.shielded():
                fn()

        return run
