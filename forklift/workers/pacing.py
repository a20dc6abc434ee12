"""Pacing: how many jobs the claim loop asks for, whether that is worth a claim now, and
how long it waits between claims when it is not."""

from __future__ import annotations

import time

from forklift.workers.config import WorkerConfig
from forklift.workers.holdings import Holdings
from forklift.workers.prefetch import Prefetch


class Pacing:
    def __init__(self, config: WorkerConfig, holdings: Holdings, prefetch: Prefetch) -> None:
        self.config = config
        self.holdings = holdings
        self.prefetch = prefetch
        self.ahead = 0  # jobs claimed ahead of the slots, as the last look decided
        self.shared = False  # the last claim took its share under a limit (Claim.shared)

    def free(self, leaving: int = 0) -> tuple[int, int]:
        """(jobs to claim now, jobs held): the free slots, plus as many ahead as the
        measured job times say will start within the prefetch budget; `leaving` held
        jobs complete in the claim's transaction (Holdings.free)."""
        self.ahead = 0
        if self.config.prefetch:
            self.ahead = self.prefetch.ahead(self.holdings.longest_running(time.monotonic()))
        return self.holdings.free(self.ahead, leaving)

    def worth_claiming(self, free: int) -> bool:
        """Claim now: a slot is idle (no claimed job waits for one), or half of what the
        worker keeps claimed is free. Not for every job that returns while others wait
        their turn: a claim per job would cost a round trip each, and under a limit each
        would wait for the limit's lock. After a claim that took its share of a limit's
        slots and left the rest to other workers, not until all it took has started:
        claims under a limit take turns at its lock, and one that finds the slots its
        peers hold still full takes nothing."""
        if not self.holdings.waiting():
            return True
        return not self.shared and 2 * free >= self.config.concurrency + self.ahead

    def busy_wait(self, longest: float | None = None) -> float:
        """Until a wake-up, or the poll interval (or `longest`); but no longer than until
        the jobs waiting for a slot would have to be released."""
        wait = self.config.poll_interval if longest is None else longest
        if self.holdings.waiting():
            return min(wait, self.prefetch.release_after)
        return wait
