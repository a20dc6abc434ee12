"""Autoscaling between MIN and MAX children by backlog and idleness, with hysteresis."""

from __future__ import annotations

from dataclasses import dataclass

from forklift.errors import ConfigError


@dataclass
class Autoscaler:
    """Decide +1 / 0 / -1 children.

    Up: there is a due backlog and every child is busy, at most once per `up_cooldown`.
    Down: no backlog and some child has been idle for `idle_for`, at most once per
    `down_cooldown`. The gap between the two rules is the hysteresis: a queue that
    drains and refills within `idle_for` never makes the count flap.
    """

    minimum: int
    maximum: int
    up_cooldown: float = 2.0
    down_cooldown: float = 10.0
    idle_for: float = 15.0
    _last_change: float = float("-inf")

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ConfigError("autoscale needs 1 <= MIN <= MAX")

    def decide(self, now: float, current: int, backlog: int, busy: int, longest_idle: float) -> int:
        if current < self.minimum:
            return 1
        if current > self.maximum:
            return -1
        since = now - self._last_change
        if backlog > 0 and busy >= current and current < self.maximum:
            if since >= self.up_cooldown:
                self._last_change = now
                return 1
            return 0
        if (
            backlog == 0
            and current > self.minimum
            and longest_idle >= self.idle_for
            and since >= self.down_cooldown
        ):
            self._last_change = now
            return -1
        return 0
