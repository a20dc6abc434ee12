"""How a worker sleeps after a claim that drained its queue: until news (a new job's
notification; a slot freed, where that matters), the next delayed job, or the poll
interval, whichever comes first."""

from __future__ import annotations

import time

from forklift.errors import DatabaseError
from forklift.store.limits import Applying
from forklift.workers.claimer import Claimer
from forklift.workers.completer import Completer
from forklift.workers.config import WorkerConfig
from forklift.workers.pacing import Pacing
from forklift.workers.wakeup import Wakeup


class IdleSleep:
    def __init__(
        self,
        config: WorkerConfig,
        claimer: Claimer,
        pacing: Pacing,
        completer: Completer,
        wakeup: Wakeup,
    ) -> None:
        self.config = config
        self.claimer = claimer
        self.pacing = pacing
        self.completer = completer
        self.wakeup = wakeup

    def sleep(self, claimed_at: float) -> None:
        """Sleep after the claim that began at `claimed_at` (monotonic) found too little."""
        wait = self._wait(claimed_at)
        if self._slots_are_news():
            self.wakeup.wait(wait)
            return
        self.completer.no_claim_coming(True)
        try:
            self.wakeup.wait_for_news(wait)
        finally:
            self.completer.no_claim_coming(False)

    def _slots_are_news(self) -> bool:
        """Whether a slot freeing is reason to claim again after a claim that drained the
        queue: under limits (a job ending may free its key for a held-back one) or
        counting jobs toward max_jobs (the loop notices it is done)."""
        return self.claimer.applying is not Applying.NONE or self.config.max_jobs is not None

    def _wait(self, claimed_at: float) -> float:
        """Until the next delayed job is due, or the poll interval, whichever first."""
        try:
            due_in = self.claimer.due_in(since=time.monotonic() - claimed_at)
        except DatabaseError:
            return self.config.poll_interval
        if due_in is None:
            return self.pacing.busy_wait()
        return self.pacing.busy_wait(min(self.config.poll_interval, due_in + 0.001))
