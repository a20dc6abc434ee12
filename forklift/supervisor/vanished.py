"""Workers that vanished with their whole process group or host, found within a second.

A worker's own supervisor charges its jobs the moment it dies; when the supervisor dies
with it (the OOM killer of a container, a lost node) no one is left to, and the jobs
waited for the registry prune (20 s) or their leases. Every worker holds a liveness lock
while it lives (workers/liveness.py), which PostgreSQL releases the moment its session
ends. Twice a second this service, on every supervisor, asks which owners of running
jobs hold none. An owner found without it in consecutive rounds `confirm` seconds apart
or more has its jobs charged (WorkerLost), in a statement that checks the lock again, so
an owner that took it back meanwhile keeps them. A live worker takes a lost lock back
within a fifth of a second of the database answering (a restart, a terminated session),
and a stall ends no session: so a worker still renewing is never charged. A round that
fails forgets what it saw: after an outage, two fresh sightings are needed.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from forklift._events import emit
from forklift._service import TestSignal
from forklift.errors import DatabaseError
from forklift.metrics import Totals
from forklift.supervisor.attribution import count_charged
from forklift.supervisor.store import SupervisorStore

log = logging.getLogger(__name__)

LOST = "WorkerLost: worker {owner} lost its database session (its process group or host is gone)"


@dataclass(frozen=True)
class VanishedConfig:
    every: float = 0.5  # seconds between rounds
    confirm: float = 1.0  # an owner unlocked this long (over consecutive rounds) is gone


@dataclass(frozen=True)
class VanishedResult:
    unlocked: int  # owners of running jobs without their liveness lock this round
    charged: int  # jobs charged this round


class VanishedOwners:
    def __init__(
        self, store: SupervisorStore, totals: Totals, config: VanishedConfig | None = None
    ) -> None:
        self.store = store
        self.totals = totals
        self.config = config or VanishedConfig()
        self.rounds = TestSignal[VanishedResult]()
        self._unlocked_since: dict[str, float] = {}  # owner -> first seen unlocked

    def run_once(self, now: float | None = None) -> VanishedResult:
        """One round (DatabaseError if the database is away: what was seen is forgotten)."""
        now = time.monotonic() if now is None else now
        try:
            unlocked = self.store.owners_unlocked()
        except DatabaseError:
            self._unlocked_since.clear()
            raise
        since = self._unlocked_since
        self._unlocked_since = {owner: since.get(owner, now) for owner in unlocked}
        charged = 0
        for owner, first in list(self._unlocked_since.items()):
            if now - first >= self.config.confirm:
                charged += self._charge(owner)
                del self._unlocked_since[owner]
        result = VanishedResult(len(unlocked), charged)
        self.rounds.emit(result)
        return result

    def _charge(self, owner: str) -> int:
        error = LOST.format(owner=owner)
        # Lost, not failed: like a job whose lease expired, each keeps its place in line
        # (its attempt counts: one that takes whole hosts down still ends dead).
        jobs = self.store.job_fail_orphaned(owner, error, retry=None, unlocked=True)
        count_charged(self.totals, jobs, error, owner)
        if jobs:
            emit(log, "registry.vanished", logging.WARNING, owner=owner, jobs=len(jobs))
        return len(jobs)
