"""Which claim a worker makes: the plain one-statement claim, or the claim under limits
(store/limits.py) when a limit covers its queues or its app's tasks.

Whether one does is looked up at most once a second, so a limit set at run time
(`forklift queues limit`) is obeyed by every replica within a second. The app's own task
limits are written before its first claim, so they hold from the first job on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from forklift._events import emit
from forklift.errors import DatabaseError
from forklift.limits import Limit
from forklift.store import Claim, Completion, ConnSource, JobStore, job_release_unknown
from forklift.store.limits import LANE_CLAIM, Applying, LimitStore
from forklift.workers.holdings import Holdings

if TYPE_CHECKING:
    from forklift.app import App
    from forklift.workers.config import WorkerConfig

log = logging.getLogger("forklift.workers.worker")

LOOK_EVERY = 1.0  # seconds between lookups of whether limits apply


class Claimer:
    def __init__(
        self,
        store: JobStore,
        limits: LimitStore,
        queues: Sequence[str],
        declared: dict[str, Limit | None],
        owner: str,
        lease: float,
        holdings: Holdings | None = None,
    ) -> None:
        self.store = store
        # The jobs this worker holds (None: no reconciliation after a claim whose answer
        # was lost), and whether one was lost since the last reconciliation.
        self.holdings = holdings
        self._unsure = False
        self.limits = limits
        self.queues = list(queues)
        self.tasks = sorted(declared)
        self.owner = owner
        self.lease = lease
        self._declared: dict[str, Limit | None] | None = declared  # until written
        self._look_at = 0.0
        self.applying = Applying.NONE  # what the last lookup found to hold
        # Per queue, the key the last claim's look at keys ended at (store/limits.sql)
        self._looked: dict[str, tuple[str, str]] = {}
        # The next ready job's due time as the last claim saw it, and when (monotonic):
        # due_in's answer right after that claim, without a lookup of its own.
        self._due: tuple[float | None, float] | None = None

    @classmethod
    def of_worker(
        cls,
        app: App,
        store: JobStore,
        conns: ConnSource,
        config: WorkerConfig,
        owner: str,
        holdings: Holdings | None = None,
    ) -> Claimer:
        """A worker's: its app's tasks and their limits, its queues, on its own connection;
        `holdings`, the jobs it holds."""
        limits = LimitStore(conns, app.schema, store.where)
        declared = {name: task.limit for name, task in app.tasks.items()}
        return cls(store, limits, config.queues, declared, owner, config.lease, holdings)

    def claim(self, free: int, *, expired: bool, complete: Sequence[Completion] = ()) -> Claim:
        """Claim up to `free` jobs, after completing `complete` in the same transaction;
        `again`: claim again at once (candidates were turned away by a limit whose keys
        are now full, others may be free).

        A claim whose answer is lost (its connection dropped: a transient error) may
        have committed, leasing jobs to this worker that it never heard of: they would
        neither run nor be renewed until their lease ran out. So the next claim first
        releases every job the database says this owner holds and `holdings` does
        not (fenced, the attempt not counted); so it does after an outcome was given
        up on a lost connection (Holdings.doubt)."""
        if self.holdings is not None and self.holdings.take_doubt():
            self._unsure = True
        if self._unsure:
            self.reconcile()
        try:
            return self._claim(free, expired=expired, complete=complete)
        except DatabaseError as exc:
            if exc.transient and self.holdings is not None:
                self._unsure = True
            raise

    def reconcile(self) -> set[int]:
        """Release the jobs leased to this owner that it does not hold; their ids."""
        assert self.holdings is not None
        released = job_release_unknown(self.store, self.owner, sorted(self.holdings.ids()))
        self._unsure = False
        if released:
            emit(log, "worker.claim_reconciled", logging.WARNING, released=len(released))
        return released

    def _claim(self, free: int, *, expired: bool, complete: Sequence[Completion]) -> Claim:
        if self._declared is not None:
            self.limits.register(self._declared)
            self._declared = None
        now = time.monotonic()
        if now >= self._look_at:
            self.applying = self.limits.apply(self.queues, self.tasks)
            self._look_at = now + LOOK_EVERY
        self._due = None
        if self.applying is Applying.NONE:
            made = self.store.job_claim_next(
                complete, self.queues, self.owner, free, self.lease, expired=expired
            )
            if made.next_due is not None:
                self._due = (made.next_due[0], now)  # (about when the database's clock read)
            return made
        completing = self.store.completion(complete, self.owner) if complete else None
        args = (self.queues, self.tasks, self.owner, free, self.lease)
        if self.applying is Applying.SHARED:
            claim = self.limits.claim_shared(*args, expired=expired, complete=completing)
            if not claim.declined:
                return claim._replace(again=len(claim.jobs) == LANE_CLAIM < free)
            # too close to a limit, or no lane free: exact (what it completed, it did)
            exact = self._exact(args, expired, None)
            return exact._replace(completed=claim.completed)
        return self._exact(args, expired, completing)

    def _exact(
        self, args: tuple[Any, ...], expired: bool, completing: tuple[str, dict[str, Any]] | None
    ) -> Claim:
        claim = self.limits.claim(*args, expired=expired, complete=completing, after=self._looked)
        self._looked.update(claim.looked)
        return claim

    def due_in(self, since: float = 0.0) -> float | None:
        """Seconds until a job held back or delayed may be claimed (0: now, a rate window
        full at the last claim, `since` seconds ago, has freed); None if nothing is
        waiting on a clock (a freed slot or a new job notifies)."""
        if self.applying is not Applying.NONE:
            return self.limits.wake_in(self.queues, self.tasks, since)
        if self._due is not None:  # the last claim looked, in its own round trip
            (due, at), self._due = self._due, None
            return None if due is None else max(0.0, due - (time.monotonic() - at))
        return self.store.job_next_available(self.queues, since)
