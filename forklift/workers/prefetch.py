"""How far ahead of its free slots a worker claims: as far as its jobs say, never more.

At concurrency 1 a worker that claims only into free slots pays a claim round trip per
job, so tiny jobs crawl; Celery's answer, a fixed prefetch multiplier, hoards long jobs
behind each other. Here the worker claims extra jobs only as far as its own measured
job times say they will start within a short budget (a few claim round trips), and a
claimed job that would wait longer than that is released at once:

- `ahead()` is how many jobs to claim beyond the free slots: the budget, times the
  slots, over the time a job takes (an exponentially weighted mean of the handlers'
  times, plus a floor for the worker's own per-job cost). A long job (or no measurement
  yet, or a job running longer than the budget right now) makes it 0: long tasks are
  never claimed ahead.
- `overdue(longest_running)` says when jobs waiting for a slot must be released: a
  running job has outrun the release budget, so what waits behind it would wait too.

Pure arithmetic over what the worker tells it (no clock of its own, no I/O): tests
drive it with numbers.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PrefetchConfig:
    # Claimed-ahead jobs must start within this many claim round trips.
    budget_round_trips: float = 4.0
    # Never plan on a claim faster than this, nor a budget shorter than this.
    min_budget: float = 0.002
    # Jobs waiting behind a running one are released once it has run this many
    # budgets (and at least `min_release_after`).
    release_budgets: float = 5.0
    min_release_after: float = 0.02
    # The worker's own cost per job on top of the handler (claim parsing, context,
    # completion): keeps the estimate finite for handlers that take no time at all.
    per_job_overhead: float = 0.00005
    # At most this many jobs claimed ahead, whatever the arithmetic says: enough to
    # cover a claim round trip at the rate one process runs tiny jobs, and no more (the
    # slots themselves are a buffer too; every held job is a lease to renew).
    cap: int = 256
    # Weight of the newest sample in the running means.
    weight: float = 0.2


class Prefetch:
    """A worker's running estimates of its claim round trip and its jobs' duration."""

    def __init__(self, slots: int, config: PrefetchConfig | None = None) -> None:
        self.slots = slots
        self.config = config or PrefetchConfig()
        self.claim_time: float | None = None  # seconds per claim statement (mean)
        self.job_time: float | None = None  # seconds per handler (mean)

    def _mean(self, old: float | None, sample: float) -> float:
        return sample if old is None else old + self.config.weight * (sample - old)

    def observe_claim(self, seconds: float) -> None:
        self.claim_time = self._mean(self.claim_time, max(0.0, seconds))

    def observe_job(self, seconds: float) -> None:
        self.job_time = self._mean(self.job_time, max(0.0, seconds))

    @property
    def budget(self) -> float:
        """Seconds within which a job claimed ahead must start."""
        cfg = self.config
        claim = self.claim_time if self.claim_time is not None else cfg.min_budget
        return max(cfg.min_budget, cfg.budget_round_trips * claim)

    @property
    def release_after(self) -> float:
        """Seconds a running job may run before the jobs waiting behind it are released."""
        cfg = self.config
        return max(cfg.min_release_after, cfg.release_budgets * self.budget)

    def ahead(self, longest_running: float = 0.0) -> int:
        """Jobs to claim beyond the free slots now, given the longest-running job's age."""
        cfg = self.config
        if self.job_time is None or longest_running > self.budget:
            return 0  # nothing measured yet, or a long job is running: claim no more
        per_job = max(self.job_time, longest_running) + cfg.per_job_overhead
        jobs = int(self.budget * self.slots / per_job)
        return max(0, min(jobs, cfg.cap))

    def overdue(self, longest_running: float) -> bool:
        """Whether jobs waiting for a slot would wait too long and must be released."""
        return longest_running > self.release_after
