"""Every delay forklift waits after a failure: exponential backoff with jitter."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from forklift.errors import ConfigError


@dataclass(frozen=True)
class Backoff:
    """Delay before retry n is `base * factor**(n-1)`, capped at `max`, spread by ±`jitter`."""

    base: float = 1.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        values = (self.base, self.factor, self.max, self.jitter)
        if not all(math.isfinite(v) for v in values) or (
            self.base < 0 or self.factor < 1 or self.max < 0 or not 0 <= self.jitter < 1
        ):
            raise ConfigError(
                "Backoff needs finite base >= 0, factor >= 1, max >= 0 and 0 <= jitter < 1"
            )

    def delay(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        exponent = max(attempt - 1, 0)
        try:
            nominal = min(self.max, self.base * float(self.factor) ** exponent)
        except OverflowError:  # a huge attempt number: the cap has long been reached
            nominal = self.max
        if not self.jitter:
            return nominal
        spread = (rng or random).uniform(-self.jitter, self.jitter)
        return max(0.0, min(self.max, nominal * (1 + spread)))


class Streak:
    """Failures in a row, and the backoff delay the latest one earns.

    For loops that retry one thing until it works (a reconnect, a claim, a restart):
    `failed()` counts a failure and returns how long to wait, `succeeded()` starts over.
    """

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.failures = 0

    def failed(self) -> float:
        self.failures += 1
        return self.backoff.delay(self.failures)

    def succeeded(self) -> None:
        self.failures = 0
