"""When each slot may start its next child, and whether the children are crash-looping.

Only a boot crash counts: a child that died before its worker loop ran (it never sent
its "booted" report). Its slot backs off exponentially, one streak per slot, so a slot
whose children cannot boot never holds back the others. A child that had booted is
replaced at once however it died and however young it was (a worker killed from
outside, a poison job): its death says nothing about whether the next one can start.
`loop_crashes` boot crashes within `window` seconds is a crash loop, until a child
started after the latest of them boots: the supervisor stays up, reports not ready,
and keeps backing off.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from forklift._events import emit
from forklift.backoff import Backoff, Streak
from forklift.supervisor.child import Child
from forklift.supervisor.exits import RestartCount
from forklift.supervisor.systemd import Notifier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RestartPolicy:
    """The backoff of a slot whose children crash at boot, and what a crash loop is."""

    base: float = 0.5  # the first boot crash in a row waits this long; each next, twice
    max_delay: float = 30.0
    loop_crashes: int = 5
    window: float = 60.0

    def backoff(self) -> Backoff:
        return Backoff(base=self.base, factor=2.0, max=self.max_delay, jitter=0)


class RestartSchedule:
    """Per slot: when its next child may start. Overall: the crash-loop flag."""

    def __init__(self, notifier: Notifier, policy: RestartPolicy | None = None) -> None:
        self.policy = policy or RestartPolicy()
        self.notifier = notifier
        self.crash_loop = False
        self._streaks: dict[int, Streak] = {}
        self._due: dict[int, float] = {}  # slot -> monotonic time its next child may start
        self._boot_crashes: deque[float] = deque()

    def due(self, slot: int, now: float) -> bool:
        """Whether slot `slot` may start a child at `now`."""
        return now >= self._due.get(slot, 0.0)

    def next_due(self, now: float) -> float | None:
        """Seconds until the next backed-off slot may start a child (None: none waits)."""
        waits = [at - now for at in self._due.values() if at > now]
        return min(waits) if waits else None

    def count(self, counts: RestartCount, slot: int, now: float) -> None:
        """Count one exit of a child of `slot` as its verdict says."""
        if counts is RestartCount.BOOT_CRASH:
            streak = self._streaks.setdefault(slot, Streak(self.policy.backoff()))
            delay = streak.failed()
            self._due[slot] = now + delay
            self._boot_crashes.append(now)
            emit(log, "child.restart_backoff", logging.WARNING, slot=slot, delay=round(delay, 2))
            self._enter_loop(now)
        elif counts is RestartCount.BOOTED:
            self._streaks.pop(slot, None)
            self._due.pop(slot, None)

    def review(self, now: float, children: Iterable[Child]) -> None:
        """Once a tick: the crash loop ends when its crashes age out of the window, or a
        child started after the latest of them has booted."""
        if not self.crash_loop:
            return
        latest = self._boot_crashes[-1] if self._boot_crashes else float("-inf")
        booted = any(c.booted and c.started > latest for c in children)
        if booted or self._recent(now) < self.policy.loop_crashes:
            self.crash_loop = False
            emit(log, "supervisor.crash_loop_over", booted=booted)
            self.notifier.status("workers are booting again")

    def _recent(self, now: float) -> int:
        while self._boot_crashes and now - self._boot_crashes[0] > self.policy.window:
            self._boot_crashes.popleft()
        return len(self._boot_crashes)

    def _enter_loop(self, now: float) -> None:
        if self.crash_loop or self._recent(now) < self.policy.loop_crashes:
            return
        self.crash_loop = True
        emit(
            log,
            "supervisor.crash_loop",
            logging.ERROR,
            crashes=self.policy.loop_crashes,
            window=self.policy.window,
        )
        self.notifier.status("workers are crash-looping")
