"""Who decides that a worker is dead, and what its jobs are charged: one authority.

Its own supervisor's reaper, else a peer that finds the owner's liveness lock free, else
lease expiry. `AUTHORITY` below is the table, row by row: who decides, about whom, on
what evidence, and what the jobs are charged. Nothing else charges a job.

Never proof of death on its own: a late registry heartbeat (the registry is for
display), an ended session of a child (its supervisor vouches for it), a notification.
A supervisor never charges its own children as a peer would: its reaper does.

Everything here runs on the supervisor's database thread (dbthread.py); the loop only
submits (`OnDbThread`). What the database was not there for waits, in order, and is
retried with backoff: a timeout's charge always comes before the release of the killed
child's other jobs, and is charged as a timeout however late it lands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

from forklift._events import emit
from forklift._ids import application_name, liveness_holder
from forklift._service import TestSignal
from forklift.backoff import Backoff, Streak
from forklift.errors import DatabaseError
from forklift.metrics import Totals
from forklift.supervisor.dbthread import DbService
from forklift.supervisor.states import JobsAction
from forklift.supervisor.store import ChargedJob, SupervisorStore

log = logging.getLogger(__name__)


class Authority(NamedTuple):
    who: str
    whom: str
    evidence: str
    charge: str


AUTHORITY = (
    Authority(
        "its own supervisor's reaper", "its own children", "the child exited (wait4)",
        "exits.decide(): FAIL (a crash to each job whose handler ran, running.py; the "
        "others released), RELEASE (killed at the shutdown deadline; bystanders of a "
        "timeout or a cancel kill) or nothing (a clean exit)",
    ),
    Authority(
        "its own supervisor's police", "one job of its own child", "it overran its timeout",
        "the kill; once the child is dead, that job: TimeoutError, no crash (the others "
        "are bystanders)",
    ),
    Authority(
        "a peer supervisor (VanishedOwners)",
        "another supervisor's children, or a `forklift worker`",
        "the liveness lock vouching for them is free in two rounds `confirm` apart",
        "each job its renewals saw running: WorkerLost, a crash (the lock checked again "
        "in the same statement); the others forgiven (_forgivable: one attempt more)",
    ),
    Authority(
        "lease expiry", "anyone", "the lease ran out unrenewed",
        "re-claimed by any worker, charged an attempt if its renewals saw it running, "
        "else forgiven; the rescuer dead-letters one out of attempts",
    ),
)  # fmt: skip

# Deferred attributions are retried 1 s after the failure, then 2, 4, ... up to 30 s apart.
DEFERRED_RETRY = Backoff(base=1.0, factor=2.0, max=30.0, jitter=0)

LOST = "WorkerLost: worker {owner} lost its database session (its process group or host is gone)"


@dataclass(frozen=True)
class Deferred:
    """An attribution the database was not there for."""

    owner: str
    error: str
    action: JobsAction | None  # None: a timeout's charge of `ids` (no crash)
    ids: tuple[int, ...] = field(default=())
    # FAIL: the jobs whose handlers ran when it died, the only ones charged a crash (the
    # rest go back uncharged); None: not known, every job it held is charged.
    running: tuple[int, ...] | None = None


class Attribution:
    """Charges or releases a dead or killed child's jobs; keeps, in order, what failed."""

    def __init__(
        self, store: SupervisorStore, totals: Totals, retry: Backoff = DEFERRED_RETRY
    ) -> None:
        self.store = store
        self.totals = totals
        self.deferred: list[Deferred] = []
        self._streak = Streak(retry)
        self._retry_at = 0.0

    @property
    def retry_at(self) -> float | None:
        """When the deferred attributions are tried again (None: there are none)."""
        return self._retry_at if self.deferred else None

    def record(
        self,
        owner: str,
        error: str,
        action: JobsAction,
        now: float,
        running: tuple[int, ...] | None = None,
    ) -> None:
        """Attribute a death to the owner's jobs now; queue it if the database is away
        (or if earlier ones wait: they go first). With `running`, a FAIL charges only
        those jobs a crash and gives the others back uncharged."""
        self._record(Deferred(owner, error, action, running=running), now)

    def charge_timeout(self, owner: str, job_id: int, reason: str, now: float) -> None:
        """Charge one job that overran its timeout, before its child is killed: a
        TimeoutError, never a crash, even if the database is away until after the death."""
        self._record(Deferred(owner, f"TimeoutError: {reason}", None, (job_id,)), now)

    def _record(self, deferred: Deferred, now: float) -> None:
        if not self.deferred and self._apply(deferred):
            return
        if not self.deferred:
            self._retry_at = now + self._streak.failed()
        self.deferred.append(deferred)

    def retry_deferred(self, now: float | None = None) -> None:
        """Retry the deferred attributions once due, in order, stopping at the first
        that fails; back off while the database stays away."""
        now = time.monotonic() if now is None else now
        if not self.deferred or now < self._retry_at:
            return
        while self.deferred and self._apply(self.deferred[0]):
            self.deferred.pop(0)
        if self.deferred:
            self._retry_at = now + self._streak.failed()
        else:
            self._streak.succeeded()

    def end_sessions(self, owner: str) -> None:
        """End the database sessions of a worker process killed or dead (best effort: one
        the database cannot be asked about ends by its own timeouts and keepalives). Its
        supervisor's liveness lock vouches for it, so no peer takes this for a death."""
        try:
            ended = self.store.backend_terminate(application_name(owner))
        except DatabaseError as exc:
            emit(log, "child.sessions_end_failed", logging.WARNING, owner=owner, error=exc)
            return
        if ended:
            emit(log, "child.sessions_ended", logging.WARNING, owner=owner, sessions=ended)

    def _apply(self, deferred: Deferred) -> bool:
        try:
            if deferred.action is None:
                self._timeout(deferred)
            elif deferred.action is JobsAction.RELEASE:
                self._release(deferred.owner, deferred.error)
            else:
                self._charge(deferred.owner, deferred.error, deferred.running)
        except DatabaseError as exc:
            emit(
                log,
                "child.attribution_deferred",
                logging.WARNING,
                owner=deferred.owner,
                error=exc,
            )
            return False
        return True

    def _timeout(self, deferred: Deferred) -> None:
        hits = self.store.job_fail_orphaned(
            deferred.owner, deferred.error, ids=list(deferred.ids), crash=False
        )
        for hit in hits:
            self.totals.job(hit.queue, hit.task, "crashed")
            emit(
                log,
                "job.timed_out",
                logging.ERROR,
                job=hit.id,
                state=hit.state,
                attempt=hit.attempts,
                owner=deferred.owner,
            )

    def _release(self, owner: str, error: str) -> None:
        self.store.job_let_go_cancelled(owner)
        for gone in self.store.job_release_owner(owner):
            self.totals.job(gone.queue, gone.task, "released")
            emit(log, "job.released", job=gone.id, owner=owner, reason=error)

    def _charge(self, owner: str, error: str, running: tuple[int, ...] | None) -> None:
        """A crash to each job whose handler ran (all it held, if that is not known);
        the others it held were innocent: claimed ahead, or done and waiting for their
        write. They go back uncharged (run again if their outcome was not written), and
        its cancelled jobs' holds end (_release)."""
        ids = None if running is None else list(running)
        # Not known which ran: those its lease renewals never saw running are forgiven.
        charged = (
            self.store.job_fail_orphaned(owner, error, ids=ids, forgive=ids is None)
            if ids != []
            else []
        )
        count_charged(self.totals, charged, error, owner)
        if running is not None:
            self._release(owner, f"not running when its worker died: {error.splitlines()[0]}")
        else:
            self.store.job_let_go_cancelled(owner)


class Deaths(Protocol):
    """What the reaper and the police tell: an Attribution, or the same on the database
    thread (OnDbThread)."""

    def record(
        self,
        owner: str,
        error: str,
        action: JobsAction,
        now: float,
        running: tuple[int, ...] | None = None,
    ) -> None: ...

    def charge_timeout(self, owner: str, job_id: int, reason: str, now: float) -> None: ...

    def end_sessions(self, owner: str) -> None: ...


class OnDbThread:
    """What the loop's reaper and police call: each call is submitted to the database
    thread (`submit`), to run on the Attribution there, in order."""

    def __init__(
        self, attribution: Attribution, submit: Callable[[str, Callable[[], object]], None]
    ) -> None:
        self.attribution = attribution
        self._submit = submit

    def record(
        self,
        owner: str,
        error: str,
        action: JobsAction,
        now: float,
        running: tuple[int, ...] | None = None,
    ) -> None:
        a = self.attribution
        self._submit("attribution", lambda: a.record(owner, error, action, now, running))

    def charge_timeout(self, owner: str, job_id: int, reason: str, now: float) -> None:
        a = self.attribution
        self._submit("attribution", lambda: a.charge_timeout(owner, job_id, reason, now))

    def end_sessions(self, owner: str) -> None:
        self._submit("attribution", lambda: self.attribution.end_sessions(owner))


def count_charged(
    totals: Totals, jobs: Iterable[ChargedJob], error: str, owner: str | None = None
) -> None:
    """Count and log jobs charged for a worker that died or vanished: each ready again
    (job.failed) or out of attempts (job.dead); one forgiven is released, not charged."""
    for job in jobs:
        fields: dict[str, object] = {"job": job.id, "attempt": job.attempts}
        if owner is not None:
            fields["owner"] = owner
        if job.forgiven:
            totals.job(job.queue, job.task, "released")
            emit(log, "job.released", logging.INFO, **fields, reason=f"not seen running: {error}")
            continue
        totals.job(job.queue, job.task, "crashed")
        dead = job.state == "dead"
        event = "job.quarantined" if job.quarantined else "job.dead" if dead else "job.failed"
        emit(log, event, logging.ERROR if dead else logging.WARNING, **fields, error=error)


# -- a peer's authority: owners whose liveness lock is free ------------------------------
#
# A child's own supervisor charges its jobs the moment it dies; when the supervisor dies
# with it (the OOM killer of a container, a lost node) no one is left to. A supervisor
# holds a liveness lock while it lives (session.py), for itself and all its children, and
# so does a `forklift worker`; PostgreSQL releases it the moment that session ends. Twice
# a second every supervisor asks which owners of running jobs have no holder of their
# lock. An owner found so in consecutive rounds `confirm` seconds apart has its jobs
# charged (WorkerLost), in a statement that checks the lock again, so one whose lock was
# taken back meanwhile keeps them. A live supervisor retakes a lost lock within a fifth
# of a second of the database answering, and a stall ends no session. A round that fails
# forgets what it saw: after an outage, two fresh sightings are needed.


@dataclass(frozen=True)
class VanishedConfig:
    every: float = 0.5  # seconds between rounds
    # The share of the database thread's time its rounds may take (DbService.share):
    # more than its other reads of the jobs table get, so that only a look over 0.1 s
    # (a held horizon's dead rows) spaces them out, and a vanished worker's jobs still
    # run again within two seconds.
    share: float = 0.2
    confirm: float = 1.0  # an owner unlocked this long (over consecutive rounds) is gone


@dataclass(frozen=True)
class VanishedResult:
    unlocked: int  # owners of running jobs without their liveness lock this round
    charged: int  # jobs charged this round


class VanishedOwners:
    def __init__(
        self,
        store: SupervisorStore,
        totals: Totals,
        config: VanishedConfig | None = None,
        me: Callable[[], str] = lambda: "",
    ) -> None:
        self.store = store
        self.totals = totals
        self.config = config or VanishedConfig()
        self.me = me  # this supervisor's id: its own children are its reaper's
        self.rounds = TestSignal[VanishedResult]()
        self._unlocked_since: dict[str, float] = {}  # owner -> first seen unlocked

    def service(self) -> DbService:
        """Its rounds, as the database thread runs them."""
        return DbService("vanished", self.config.every, self.run_once, self.config.share)

    def run_once(self, now: float | None = None) -> VanishedResult:
        """One round (DatabaseError if the database is away: what was seen is forgotten)."""
        now = time.monotonic() if now is None else now
        try:
            me = self.me()
            unlocked = [o for o in self.store.owners_unlocked() if liveness_holder(o) != me]
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
        # Lost, not failed: like a job whose lease expired, each keeps its place in line,
        # and as there, a job its renewals never saw running is forgiven (at most 3
        # times: one that takes whole hosts down still ends dead).
        jobs = self.store.job_fail_orphaned(owner, error, retry=None, unlocked=True, forgive=True)
        count_charged(self.totals, jobs, error, owner)
        if jobs:
            emit(log, "registry.vanished", logging.WARNING, owner=owner, jobs=len(jobs))
        return len(jobs)
