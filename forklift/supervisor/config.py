"""SupervisorConfig: the knobs of `forklift run`, with their defaults."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from forklift.errors import ConfigError
from forklift.scheduler.config import SchedulerConfig
from forklift.supervisor.states import StopMode
from forklift.workers.config import WorkerConfig

# What systemd (EXTEND_TIMEOUT_USEC, TimeoutStopSec) must allow beyond a stop's budget.
STOP_MARGIN = 2.0


@dataclass(frozen=True)
class SupervisorConfig:
    """How the parent keeps its children."""

    workers: int = field(default_factory=lambda: os.cpu_count() or 1)
    worker: WorkerConfig = field(default_factory=WorkerConfig)
    # Recycle a child after this many jobs (None: never).
    max_jobs_per_child: int | None = None
    # Recycle a child whose RSS passes this many MiB after its current job; kill it
    # (and attribute its jobs) past `hard_memory_factor` times the limit.
    max_memory_per_child: float | None = None
    hard_memory_factor: float = 1.5
    # Autoscale between (min, max) children by backlog; None keeps `workers` fixed.
    autoscale: tuple[int, int] | None = None
    # Autoscale down after a child has idled this long (and at most once per this).
    autoscale_idle: float = 15.0
    # A child silent this long is wedged and gets killed.
    child_timeout: float = 30.0
    # SIGTERM before SIGKILL when the supervisor kills a child (timeout, memory, hang).
    kill_grace: float = 3.0
    # How long a cancelled job's handler may run on before its child is killed.
    cancel_grace: float = 5.0
    metrics_addr: str | None = None
    # At boot, a database refusing forklift this long (authentication, no such database)
    # makes the supervisor exit 1 instead of retrying forever.
    refused_grace: float = 10.0
    # The cron scheduler every supervisor runs (one job per fire time across replicas).
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError("workers must be >= 1")
        if self.max_jobs_per_child is not None and self.max_jobs_per_child < 1:
            raise ConfigError("max_jobs_per_child must be >= 1")
        if self.max_memory_per_child is not None and self.max_memory_per_child <= 0:
            raise ConfigError("max_memory_per_child must be > 0 MiB")
        if self.child_timeout < 1:
            raise ConfigError("child_timeout must be >= 1 second (children report every 0.5 s)")
        if self.kill_grace < 0:
            raise ConfigError("kill_grace must be >= 0")
        if self.cancel_grace < 0:
            raise ConfigError("cancel_grace must be >= 0")
        if self.refused_grace < 0:
            raise ConfigError("refused_grace must be >= 0")
        if self.autoscale_idle <= 0:
            raise ConfigError("autoscale_idle must be > 0")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 1 <= low <= high:
                raise ConfigError("autoscale needs 1 <= MIN <= MAX")

    def stop_budget(self, mode: StopMode) -> float:
        """Seconds from a stop to the SIGKILL of what is left: grace unless fast, kill_grace."""
        grace = 0.0 if mode is StopMode.FAST else self.worker.grace
        return grace + self.kill_grace

    def stop_timeout(self, mode: StopMode) -> float:
        """What systemd is told a stop may take: its budget and a margin."""
        return self.stop_budget(mode) + STOP_MARGIN

    @property
    def shutdown_budget(self) -> float:
        """Longest a graceful stop takes: grace, then kill_grace, then a margin."""
        return self.stop_timeout(StopMode.GRACEFUL)
