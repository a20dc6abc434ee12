"""The scheduler's settings (here, apart from the scheduler: the CLI's flags read them)."""

from __future__ import annotations

from dataclasses import dataclass

from forklift.errors import ConfigError


@dataclass(frozen=True)
class SchedulerConfig:
    """How often a round runs, and how far ahead of its fire time a job is enqueued."""

    tick: float = 1.0
    ahead: float = 3.0  # more than a tick, so a late round still enqueues in time
    max_fires: int = 100  # per schedule per round (a long catch-up takes a few rounds)

    def __post_init__(self) -> None:
        if self.tick <= 0:
            raise ConfigError("the scheduler's tick must be > 0 seconds")
        if self.ahead < self.tick:
            raise ConfigError("schedule_ahead must be at least the scheduler's tick")
