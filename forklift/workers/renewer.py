"""Lease renewal: one statement renews every held lease; a lease found gone is lost."""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import NamedTuple

from forklift._service import TestSignal, run_every
from forklift.metrics import Tally
from forklift.store import JobStore
from forklift.workers.cancels import Cancels
from forklift.workers.context import Stage, Writing
from forklift.workers.events import JobEvents
from forklift.workers.holdings import Holdings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RenewerConfig:
    """How long a lease lasts; it is renewed every third of that."""

    lease: float = 30.0

    @property
    def interval(self) -> float:
        return self.lease / 3


class Renewed(NamedTuple):
    """What one renewal did: leases extended, and leases found lost."""

    kept: int
    lost: int


NOTHING_HELD = Renewed(0, 0)

RETRY = 0.5  # seconds from a failed renewal to the next try
# A renewal tells the database which jobs' handlers were called: a lost lease charges
# those an attempt, and forgives the others (claimed ahead, never started).
SEEN = frozenset((Stage.RUNNING, Stage.RAN))


class LeaseRenewer:
    """Renews the leases of every held job; tells the handler of a lost one to stop."""

    def __init__(
        self,
        store: JobStore,
        owner: str,
        holdings: Holdings,
        events: JobEvents,
        tally: Tally | None,
        closing: threading.Event,
        config: RenewerConfig | None = None,
        cancels: Cancels | None = None,
    ) -> None:
        self.store = store
        self.owner = owner
        self.holdings = holdings
        self.events = events
        self.tally = tally
        self.closing = closing
        self.config = config or RenewerConfig()
        self.cancels = cancels
        self.renewed: TestSignal[Renewed] = TestSignal()
        self._failed = False  # the last renewal failed: the next is due sooner

    def run(self) -> None:
        """Renew every interval until closing; a failed renewal is logged, not fatal, and
        tried again within RETRY seconds, not an interval later: a connection lost
        mid-renewal leaves the leases' state unknown, and the lease runs meanwhile."""
        run_every(self._wait, self._renew, self.closing, log, "lease.renew_failed")

    def _wait(self) -> float:
        return min(RETRY, self.config.interval) if self._failed else self.config.interval

    def _renew(self) -> Renewed:
        self._failed = True
        renewed = self.run_once()
        self._failed = False
        return renewed

    def run_once(self) -> Renewed:
        """Renew every held lease in one statement; mark the ones found gone as lost.

        A lost job's handler is told to stop (ctx.cancelled); its outcome, when it
        returns, will be refused by the fence. A lease an operator's cancel took is no
        loss: it is heard as the cancel (its notification may have been missed).
        """
        held = [c for c in self.holdings.snapshot() if c.writing is not Writing.WRITTEN]
        if not held:
            self.renewed.emit(NOTHING_HELD)
            return NOTHING_HELD
        kept = self.store.lease_renew_many(
            [(c.job_id, c.attempt) for c in held],
            self.owner,
            self.config.lease,
            seen=[c.job_id for c in held if c.stage in SEEN],
        )
        if self.tally is not None:
            self.tally.renewed(len(kept))
        # A lease gone whose outcome was taken is not lost: its write ended it, or will
        # find it lost and say so (Holdings: the take comes before the write is sent).
        lost = [c for c in held if c.job_id not in kept and c.writing is Writing.NONE]
        for ctx in lost:
            ctx.cancel()
        cancelled = self.cancels.among_lost(lost) if lost and self.cancels else set()
        for ctx in lost:
            if ctx.job_id not in cancelled and not ctx.cancel_requested:
                self.events.emit(
                    "job.lease_lost", ctx, logging.WARNING, effect="handler told to stop"
                )
        result = Renewed(len(kept), len(lost))
        self.renewed.emit(result)
        return result
