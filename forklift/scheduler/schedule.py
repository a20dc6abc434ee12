"""Schedule: one declared schedule, what its jobs look like, and its definition hash."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from forklift.scheduler.fire_times import Every, FireTimes

if TYPE_CHECKING:
    from forklift.store import NewJob


@dataclass(frozen=True)
class Schedule:
    """When a task is enqueued (cron in a zone, or every N seconds) and with what.

    `job` is the job of every fire, built and checked as any enqueue's (_job.build),
    which each fire inserts with its key and its fire time. `catchup` is the misfire
    window in seconds (None: after downtime only the most recent missed fire runs);
    with `overlap` false a fire is skipped while an earlier one's job is in progress.
    """

    name: str
    job: NewJob = field(hash=False)  # a NewJob is mutable: compared, never hashed
    cron: str | None
    every: int | None
    tz: str
    catchup: float | None
    overlap: bool
    times: FireTimes = field(compare=False, repr=False)

    @property
    def task(self) -> str:
        return self.job.task

    @property
    def args(self) -> str:
        """The jobs' arguments, as validated JSON text."""
        return self.job.args

    @property
    def queue(self) -> str:
        return self.job.queue

    @property
    def priority(self) -> int:
        return self.job.priority

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def timeout(self) -> float | None:
        return self.job.timeout

    @property
    def definition_hash(self) -> str:
        """What identifies this definition: a change restarts the schedule from it."""
        parts = {
            "task": self.task,
            "args": json.loads(self.args),
            "queue": self.queue,
            "priority": self.priority,
            "max_attempts": self.max_attempts,
            "cron": self.cron,
            "every": self.every,
            "tz": self.tz,
            "catchup": self.catchup,
            "overlap": self.overlap,
        }
        text = json.dumps(parts, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def key(self, fire: datetime) -> str:
        """The idempotency key of the job for `fire`: the same on every replica."""
        return f"forklift:schedule:{self.name}:{fire.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"

    def job_at(self, fire: datetime) -> NewJob:
        """The job for `fire`: due then, under its key."""
        return replace(self.job, idempotency_key=self.key(fire), run_at=fire)

    def interval(self, now: datetime) -> float | None:
        """Seconds between the fire times around `now` (None if it never fires again)."""
        if isinstance(self.times, Every):
            return float(self.times.seconds)
        following = self.times.after(now)
        before = self.times.latest(now)
        if following is None:
            return None
        if before is None:
            after_that = self.times.after(following)
            return None if after_that is None else (after_that - following).total_seconds()
        return (following - before).total_seconds()

    def describe(self) -> str:
        """How it is timed, as an operator reads it: `0 3 * * *` or `every 5m`."""
        if self.cron is not None:
            return self.cron
        return f"every {format_every(self.every or 0)}"


def format_every(seconds: int) -> str:
    """An interval as written by people: 30s, 5m, 1h30m, 1d."""
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size:
            parts.append(f"{seconds // size}{unit}")
            seconds %= size
    return "".join(parts) or "0s"
