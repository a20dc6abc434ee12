"""What the testing helpers give back and raise: each job run (Ran), a drain's summary
(Drained), and the errors a test asserts on."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from forklift.testing._store import shown
from forklift.testing.processes import WaitTimedOut

# How a run ended (Ran.outcome): the worker's outcomes (workers/events.py, Outcome), of
# which inline mode and run_job know succeeded, failed and snoozed.
SUCCEEDED = "succeeded"
FAILED = "failed"  # raised; a drained job is retried after its backoff, an inline one never
DEAD = "dead"  # raised with no attempt left, or forklift.Fail (drain only)
# forklift.Snooze (raised or returned): a drained job runs again once due (at once with
# `with_scheduled`), its attempt not counted; an inline one never runs again.
SNOOZED = "snoozed"


@dataclass(frozen=True)
class Ran:
    """One attempt of one job that a testing helper ran, and how it ended."""

    job_id: int
    task: str
    args: dict[str, Any]
    attempt: int
    # succeeded, failed (to be retried), dead, snoozed; for a drained job also released,
    # lease_lost, cancelled or error (the worker's own outcomes: see Outcome).
    outcome: str
    result: Any = None  # what it returned, as app.result() gives it (JSON, decoded)
    error: str | None = None  # "RuntimeError: boom", for an attempt that failed
    traceback: str | None = field(default=None, repr=False)
    # A snoozed run's seconds, inline and in run_job (a drained one's: None, as the job's
    # row keeps no delay per run).
    snoozed_for: float | None = None

    def __str__(self) -> str:
        said = f": {self.error}" if self.error else ""
        return f"{self.task}#{self.job_id} attempt {self.attempt} {self.outcome}{said}"


@dataclass(frozen=True)
class Drained:
    """What `drain()` ran: every attempt, in the order they ended, and how many due jobs it
    `left` (ready, but no claim would take them: held back by a limit, a paused queue)."""

    ran: list[Ran]
    left: int = 0

    def outcome(self, outcome: str) -> list[Ran]:
        return [r for r in self.ran if r.outcome == outcome]

    @property
    def succeeded(self) -> list[Ran]:
        return self.outcome(SUCCEEDED)

    @property
    def failed(self) -> list[Ran]:
        """The attempts that failed and are to be retried (after their backoff)."""
        return self.outcome(FAILED)

    @property
    def dead(self) -> list[Ran]:
        return self.outcome(DEAD)

    @property
    def snoozed(self) -> list[Ran]:
        """The runs that snoozed (forklift.Snooze): their attempts were not counted."""
        return self.outcome(SNOOZED)

    def counts(self) -> dict[str, int]:
        """{outcome: attempts}: `{"succeeded": 2, "failed": 1}`."""
        return dict(Counter(r.outcome for r in self.ran))

    def __str__(self) -> str:
        lines = [str(r) for r in self.ran] or ["nothing ran"]
        if self.left:
            lines.append(f"{self.left} due job(s) left unclaimed")
        return "\n".join(lines)


class HandlerFailed(Exception):
    """A job run in the test's own process (inline mode, run_job) failed: its handler
    raised (the exception is this one's `__cause__`), or ended as the worker would fail
    it (a result that is not JSON, a run past its timeout). `ran` says which job it was
    and how it ended; `task`, `job_args` and `job_id` are its parts."""

    def __init__(self, ran: Ran) -> None:
        super().__init__(
            f"job {ran.task}#{ran.job_id} failed: {ran.error} (args {shown(ran.args)})"
        )
        self.ran = ran
        self.task = ran.task
        self.job_id = ran.job_id
        self.job_args = ran.args
        self.error = ran.error


class InlineUnsupported(RuntimeError):
    """What was asked needs job rows in the database, and inline mode writes none."""


class DrainTimedOut(WaitTimedOut):
    """drain() still had jobs to run (or one still running) at its deadline."""
