"""How many children the supervisor keeps: the target, moved by TTIN/TTOU and autoscaling."""

from __future__ import annotations

import logging

from forklift._events import emit
from forklift.errors import DatabaseError
from forklift.supervisor.autoscale import Autoscaler
from forklift.supervisor.child import Child
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.store import SupervisorStore

log = logging.getLogger(__name__)

AUTOSCALE_EVERY = 2.0  # seconds between backlog reads


class Scaling:
    def __init__(self, config: SupervisorConfig, store: SupervisorStore) -> None:
        self.config = config
        self.store = store
        bounds = config.autoscale
        idle = config.autoscale_idle
        self.autoscaler = (
            Autoscaler(*bounds, idle_for=idle, down_cooldown=min(10.0, idle)) if bounds else None
        )
        self.target = bounds[0] if bounds else config.workers
        self._next_autoscale = 0.0
        self.backlog: int | None = None  # read on the database thread; None: not known

    def set_target(self, n: int) -> None:
        """Keep `n` children, within the autoscale bounds if there are any."""
        low, high = self.config.autoscale or (1, 10_000)
        self.target = max(low, min(high, n))
        emit(log, "supervisor.scale", workers=self.target)

    def read_backlog(self) -> None:
        """On the database thread: the backlog the next autoscale step reads (the loop
        never waits on the database for it). None while the database is away."""
        if self.autoscaler is None:
            return
        try:
            self.backlog = self.store.job_backlog(self.config.worker.queues)
        except DatabaseError:
            self.backlog = None
            raise

    def autoscale(self, live: list[Child], now: float) -> None:
        """Every AUTOSCALE_EVERY seconds: one child more or fewer, as the backlog says."""
        if self.autoscaler is None or now < self._next_autoscale:
            return
        self._next_autoscale = now + AUTOSCALE_EVERY
        backlog = self.backlog
        if backlog is None:
            return
        slots = self.config.worker.concurrency
        # A child running jobs too short to be told one by one is saturated too.
        busy = sum(1 for c in live if len(c.jobs) >= slots or c.ran_recently)
        idle = [now - c.idle_since for c in live if c.idle_since is not None]
        delta = self.autoscaler.decide(now, len(live), backlog, busy, max(idle, default=0.0))
        if delta:
            self.set_target(len(live) + delta)
