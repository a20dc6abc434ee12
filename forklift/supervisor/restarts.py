"""When to start a replacement child: at once, after backoff, or in crash-loop backoff."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field

from forklift._events import emit
from forklift.backoff import Backoff, Streak
from forklift.supervisor.exits import RestartCount
from forklift.supervisor.systemd import Notifier

log = logging.getLogger(__name__)


@dataclass
class RestartPolicy:
    """Exponential backoff for children that crash soon after boot.

    A child that crashes after running a while is replaced at once. One that dies within
    `fast_crash` seconds of starting counts as a fast crash; each one in a row doubles
    the delay (from `base` up to `max_delay`). `loop_crashes` fast crashes within
    `window` seconds is a crash loop: the supervisor stays up, reports not ready, and
    keeps backing off.
    """

    fast_crash: float = 5.0
    base: float = 0.5
    max_delay: float = 30.0
    loop_crashes: int = 5
    window: float = 60.0
    _fast: deque[float] = field(default_factory=deque)
    _streak: Streak = field(init=False)

    def __post_init__(self) -> None:
        self._streak = Streak(Backoff(base=self.base, factor=2.0, max=self.max_delay, jitter=0))

    def crashed(self, now: float, uptime: float) -> float:
        """Record a crash; return seconds to wait before the replacement."""
        if uptime >= self.fast_crash:
            self._streak.succeeded()
            return 0.0
        self._fast.append(now)
        return self._streak.failed()

    def healthy(self) -> None:
        """A child has run past `fast_crash`: the streak is over."""
        self._streak.succeeded()

    def in_crash_loop(self, now: float) -> bool:
        while self._fast and now - self._fast[0] > self.window:
            self._fast.popleft()
        return len(self._fast) >= self.loop_crashes


class RestartSchedule:
    """When the next child may start, and whether the children are crash-looping."""

    def __init__(self, notifier: Notifier, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self.notifier = notifier
        self.restart_at = 0.0  # monotonic: no child starts before it
        self.crash_loop = False

    def count(self, counts: RestartCount, now: float, uptime: float) -> None:
        """Count one exit as its verdict says."""
        if counts is RestartCount.CLEAN:
            if uptime >= self.policy.fast_crash:
                self.policy.healthy()
        elif counts is RestartCount.CRASH:
            self._crashed(now, uptime)

    def _crashed(self, now: float, uptime: float) -> None:
        delay = self.policy.crashed(now, uptime)
        was_loop, self.crash_loop = self.crash_loop, self.policy.in_crash_loop(now)
        if self.crash_loop and not was_loop:
            emit(
                log,
                "supervisor.crash_loop",
                logging.ERROR,
                crashes=self.policy.loop_crashes,
                window=self.policy.window,
            )
            self.notifier.status("workers are crash-looping")
        if delay > 0:
            self.restart_at = max(self.restart_at, now + delay)
            emit(log, "child.restart_backoff", logging.WARNING, delay=round(delay, 2))
        elif not self.crash_loop:
            self.restart_at = now
