"""When to start a replacement child: at once, after backoff, or in crash-loop backoff."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from forklift.backoff import Backoff, Streak


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
