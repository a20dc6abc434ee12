"""What every background service shares: test signals, and the thin loop around run_once().

A service (the completer, the lease renewer, the registry heartbeat, ...) is an object
with its collaborators passed in and a `run_once()` that does one round and returns what
it did. Tests call `run_once()` directly, or run the loop and wait on the service's test
signals instead of sleeping (River's testsignal pattern).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

from forklift._events import emit
from forklift.errors import ForkliftError

T = TypeVar("T")


class TestSignal(Generic[T]):
    """One kind of event a service reports for tests; a no-op until a test enables it."""

    __test__ = False  # not a pytest test class, whatever its name

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[T] | None = None

    def enable(self) -> None:
        """Start recording (tests only; in production emit() stays a no-op)."""
        self._queue = queue.SimpleQueue()

    def emit(self, value: T) -> None:
        if self._queue is not None:
            self._queue.put(value)

    def wait(self, timeout: float = 10.0) -> T:
        """The next value emitted; AssertionError if none comes within `timeout`."""
        if self._queue is None:
            raise RuntimeError("TestSignal.wait() before enable()")
        try:
            return self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no test signal within {timeout} s") from None


class Repeats:
    """Whether a failure is worth a log line: a new error, or the same one after
    `quiet` seconds. A database that stays down, or a schema not yet migrated, is said
    once in a while, not once per retry."""

    def __init__(self, quiet: float = 30.0) -> None:
        self.quiet = quiet
        self._last = ""
        self._next = float("-inf")

    def worth_logging(self, error: BaseException) -> bool:
        text, now = str(error), time.monotonic()
        if text == self._last and now < self._next:
            return False
        self._last, self._next = text, now + self.quiet
        return True

    def clear(self) -> None:
        self._last = ""


def run_every(
    interval: float | Callable[[], float],
    run_once: Callable[[], object],
    stopped: threading.Event,
    log: logging.Logger,
    event: str,
) -> None:
    """Call `run_once` every `interval` seconds until `stopped` is set.

    A forklift error is logged as `event` (a warning; the same error again only every
    30 s) and the loop carries on: a service outlives a database outage.
    """
    wait = interval if callable(interval) else (lambda: interval)
    repeats = Repeats()
    while not stopped.wait(wait()):
        try:
            run_once()
        except ForkliftError as exc:
            if repeats.worth_logging(exc):
                emit(log, event, logging.WARNING, error=exc)
        else:
            repeats.clear()
