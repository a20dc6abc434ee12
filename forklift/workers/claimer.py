"""Which claim a worker makes: the plain one-statement claim; the claim in turns across
fair keys (store/fair.sql) when fair jobs wait in its queues; or the claim under limits
(store/limits.py) when a limit covers its queues or its app's tasks.

Whether one does is looked up at most once a second, so a limit set at run time
(`forklift queues limit`) is obeyed by every replica within a second. The app's own task
limits are written before its first claim, so they hold from the first job on. Fair jobs
are looked for by what waits, not by what the app declares: a producer of another app,
or an enqueue to another queue, is served in turns all the same. The plain claim of one
queue leaves them alone, and says when it found its own line empty while they wait: the
worker claims them in turns at once, not at its next lookup. (A worker whose plain line
never empties finds them at that lookup, within a second.)
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forklift._events import emit
from forklift.errors import DatabaseError
from forklift.limits import Limit
from forklift.store import (
    Claim,
    Completion,
    ConnSource,
    JobStore,
    job_release_requiring,
    job_release_unknown,
)
from forklift.store.limits import LANE_CLAIM, Applying, LimitStore
from forklift.workers.holdings import Holdings

if TYPE_CHECKING:
    from forklift.app import App
    from forklift.workers.config import WorkerConfig

log = logging.getLogger("forklift.workers.worker")

LOOK_EVERY = 1.0  # seconds between lookups of whether limits apply
# The least time between two rewinds (claims read from the start of the line) of a
# worker that claims from its floor all along, and how many times a rewind's own time
# the next one waits at least (Floors).
REWIND_EVERY = 1.0
REWIND_SHARE = 100.0


class Floors:
    """Where a worker's next claim of each queue starts reading its default-priority
    jobs (job_claim_one's `floor`: the due time of the last one it took, or a second
    before it last emptied the line), so that a claim does not walk the dead versions
    of the jobs claimed before it, which pile up in the ready index while another
    transaction holds the horizon (store/queries.sql, job_claim_one).

    A job can turn ready behind a floor: given back (a graceful stop, a dead worker's
    job forgiven, a lost claim's reconciliation: it keeps its place in line), enqueued
    by a transaction that committed more than a second after it began, or due at a time
    already past (a past `run_at`, a schedule's catch-up). So a claim now and then
    rewinds (no floor): one that took nothing from its floor at once (each of those
    ways wakes the queue's workers, and an idle worker's claim comes back empty), and
    one of a worker that takes jobs all along at least every REWIND_EVERY; neither
    sooner than REWIND_SHARE times as long as the last rewind took after it, which
    keeps the walk to a hundredth of the claimer's time however many dead versions
    there are. Such a job waits for that rewind: none waits for ever."""

    def __init__(self) -> None:
        self._at: dict[str, datetime] = {}
        self._rewound = -math.inf  # when the last rewind began (monotonic)
        # How long the last few rewinds took; the least of them is what one costs (a
        # stall of the machine's, a checkpoint, does not push the next ones off).
        self._took: deque[float] = deque(maxlen=3)

    def floor(self, queue: str, now: float, *, empty: bool = False) -> datetime | None:
        """Where a claim of `queue` made at `now` (monotonic) starts; None: a rewind.
        `empty`: the claim before it, from its floor, took nothing."""
        wait = REWIND_SHARE * min(self._took, default=0.0)
        if now - self._rewound >= (wait if empty else max(REWIND_EVERY, wait)):
            return None
        return self._at.get(queue)

    def claimed(self, queue: str, began: float, claim: Claim, floor: datetime | None) -> None:
        """Record where `claim` of `queue`, made at `began` from `floor`, says the next
        one may start."""
        if claim.floor is None:  # not job_claim_one: no floor of its own
            return
        if floor is None:
            self._rewound = began
            if queue in self._at:  # (a process's first claim is slow: cold caches)
                self._took.append(time.monotonic() - began)
        self._at[queue] = claim.floor

    def rewind(self) -> None:
        """Have the next claim read from the start (its jobs may be behind the floor)."""
        self._rewound = -math.inf


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
        labels: Sequence[str] = (),
    ) -> None:
        self.store = store
        self.labels = list(labels)  # its host's (forklift run --labels)
        # The labels each of its app's tasks requires, for those that require any.
        self.requires: dict[str, tuple[str, ...]] = {}
        # The slots a job of each task that costs more than one takes (workers/slots.py).
        self.costs = holdings.costs if holdings is not None else {}
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
        self.fair = False  # whether fair jobs waited in its queues at the last lookup
        # Per queue, the key the last claim's look at keys ended at (store/limits.sql)
        self._looked: dict[str, tuple[str, str]] = {}
        # The next ready job's due time as the last claim saw it, and when (monotonic):
        # due_in's answer right after that claim, without a lookup of its own.
        self._due: tuple[float | None, float] | None = None
        self.floors = Floors()

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
        claimer = cls(
            store, limits, config.queues, declared, owner, config.lease, holdings, config.labels
        )
        claimer.requires = {name: t.requires for name, t in app.tasks.items() if t.requires}
        return claimer

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
            made = self._misplaced(self._claim(free, expired=expired, complete=complete))
            return self._fitted(made, free)
        except DatabaseError as exc:
            if exc.transient and self.holdings is not None:
                self._unsure = True
            # What failed it (a restart, killed backends) may have rolled back other
            # claims too: jobs they had locked, which this one skipped, are behind.
            self.floors.rewind()
            raise

    def _misplaced(self, made: Claim) -> Claim:
        """`made` without the jobs this worker may not run: their task requires labels
        it lacks, which their row does not say (a producer that did not declare the task
        stored none). Given back at once, attempt not counted, with the labels stored, so
        that only a worker that has them claims them again. If that fails, they are
        released at the next claim (reconcile) and come back here until it does not."""
        if not self.requires:  # no task of its app requires labels: nothing to look at
            return made
        wanted = [(j, self.requires[j.task]) for j in made.jobs if j.task in self.requires]
        wrong = [(j, r) for j, r in wanted if not set(r) <= set(self.labels)]
        if not wrong:
            return made
        held = [(j.id, j.attempt, ",".join(r)) for j, r in wrong]
        try:
            job_release_requiring(self.store, held, self.owner)
        except DatabaseError as exc:
            self._unsure = True
            emit(log, "worker.release_failed", logging.WARNING, error=exc)
        emit(log, "worker.jobs_misplaced", logging.WARNING, jobs=[j.id for j, _ in wrong])
        ids = {j.id for j, _ in wrong}
        return made._replace(jobs=[j for j in made.jobs if j.id not in ids])

    def _fitted(self, made: Claim, free: int) -> Claim:
        """`made` without the jobs past the `free` slots by their cost (workers/slots.py):
        the jobs in line order while their costs fit, and the first whatever it costs (it
        waits for its slots, SlotGate, holding its place: a costly job is not passed over
        for ever by cheap ones). The rest are given back at once, attempt not counted, in
        their place in line, for a worker with the slots; if that fails, they are
        released at the next claim (reconcile)."""
        if not self.costs or len(made.jobs) < 2:
            return made
        used, keep = 0, 0
        for job in made.jobs:
            used += self.costs.get(job.task, 1)
            if keep and used > free:
                break
            keep += 1
        if keep == len(made.jobs):
            return made
        extra = made.jobs[keep:]
        try:
            self.store.job_release_many([(j.id, j.attempt) for j in extra], self.owner)
        except DatabaseError as exc:
            self._unsure = True
            emit(log, "worker.release_failed", logging.WARNING, error=exc)
        self.floors.rewind()  # given back in their place in line: behind the floor
        return made._replace(jobs=made.jobs[:keep])

    def reconcile(self) -> set[int]:
        """Release the jobs leased to this owner that it does not hold; their ids."""
        assert self.holdings is not None
        released = job_release_unknown(self.store, self.owner, sorted(self.holdings.ids()))
        self._unsure = False
        if released:
            self.floors.rewind()  # given back in their place in line: behind the floor
            emit(log, "worker.claim_reconciled", logging.WARNING, released=len(released))
        return released

    def _claim(self, free: int, *, expired: bool, complete: Sequence[Completion]) -> Claim:
        """A labelled worker's claim: first the jobs that require its labels (only such a
        worker can run them), then, in the slots left, as any worker (_unlabelled)."""
        if not self.labels:
            return self._unlabelled(free, expired=expired, complete=complete)
        made = self.store.job_claim_next(
            complete, self.queues, self.owner, free, self.lease, expired=expired, labels=self.labels
        )
        if len(made.jobs) >= free:
            return made
        rest = self._unlabelled(free - len(made.jobs), expired=expired, complete=())
        # The plain claim's look at what falls due next knows nothing of the jobs that
        # require labels: due_in looks them up (job_next_available sees both).
        self._due = None
        return rest._replace(jobs=made.jobs + rest.jobs, completed=made.completed)

    def _unlabelled(self, free: int, *, expired: bool, complete: Sequence[Completion]) -> Claim:
        if self._declared is not None:
            self.limits.register(self._declared)
            self._declared = None
        now = time.monotonic()
        if now >= self._look_at:
            self.applying = self.limits.apply(self.queues, self.tasks)
            self.fair = self.applying is Applying.NONE and self.limits.fair_waiting
            self._look_at = now + LOOK_EVERY
        self._due = None
        if self.fair:
            return self._fair(complete, free, expired)
        if self.applying is Applying.NONE:
            queue = self.queues[0]
            floor = self.floors.floor(queue, time.monotonic())
            made = self._plain(complete, free, expired, floor)
            empty = not made.jobs and made.floor is not None and floor is not None
            if empty and self.floors.floor(queue, time.monotonic(), empty=True) is None:
                made = self._plain((), free, expired, None)._replace(completed=made.completed)
            if made.fair_waiting:  # fair jobs came: take them in turns from now on
                self.fair = True
                more = self._fair((), free - len(made.jobs), expired)
                return made._replace(jobs=made.jobs + more.jobs)
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

    def _fair(self, complete: Sequence[Completion], free: int, expired: bool) -> Claim:
        """The claim in turns across fair keys (store/fair.sql), of every queue."""
        return self.store.job_claim_next(
            complete, self.queues, self.owner, free, self.lease, expired=expired, fair=True
        )

    def _plain(
        self, complete: Sequence[Completion], free: int, expired: bool, floor: datetime | None
    ) -> Claim:
        """The plain claim, of one queue from `floor` (None: a rewind), or of several."""
        began = time.monotonic()
        made = self.store.job_claim_next(
            complete, self.queues, self.owner, free, self.lease, expired=expired, floor=floor
        )
        self.floors.claimed(self.queues[0], began, made, floor)
        return made

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
