"""The rows the job store takes and gives: a job to insert, a job claimed, job states."""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, NamedTuple


@dataclass(slots=True)
class NewJob:
    """A job to insert; `args` is already-validated JSON text."""

    task: str
    args: str
    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    timeout: float | None = None
    idempotency_key: str | None = None
    run_at: datetime | None = None
    delay: float = 0.0
    max_crashes: int = 2  # worker deaths it may cause before it is quarantined (dead)
    batch_id: int | None = None
    limit_key: str | None = None  # its task limit's key value (Limit(key=...))
    trace_context: str | None = None  # its enqueue span's W3C context, JSON (_tracing.py)
    # A fair task's job (forklift/fair.py): its key's value, and its weight (None: 1).
    fair_key: str | None = None
    fair_weight: float | None = None
    # A unique job's (forklift/unique.py): its key before the period's number, the period
    # (seconds; None: none), the states its key holds in (a bitmask), and what an enqueue
    # does when a live job holds the key ("keep", "replace" or "raise").
    unique_key: str | None = None
    unique_period: float | None = None
    unique_states: int | None = None
    on_conflict: str = "keep"
    # The labels a worker must have to run it (its task's `requires`), sorted and joined
    # by commas; None: any worker may.
    requires: str | None = None

    @property
    def due_now(self) -> bool:
        return self.run_at is None and self.delay <= 0


class Claim(NamedTuple):
    """What a claim took: its jobs, whether to claim again at once, and the ids of the
    successes completed in its transaction."""

    jobs: list[ClaimedJob]
    again: bool = False
    completed: set[int] = set()  # noqa: RUF012 (never mutated: a fresh set per claim)
    declined: bool = False  # the shared path declined: claim on the exact path
    # Per queue, the (task, key) its look at the keys of limited jobs ended at: where
    # the next claim's look starts (store/limits.sql, job_claim_limited).
    looked: dict[str, tuple[str, str]] = {}  # noqa: RUF012 (never mutated)
    # It took its worker's share of the slots under its limits (the rest is for other
    # workers): claim again once what it took has started, not at once.
    shared: bool = False
    # Seconds until the next ready job is due as the claim left the queue, if it looked
    # (job_claim_one, when it did not fill): (None,) if none is ready; None: not looked.
    next_due: tuple[float | None] | None = None
    # Where the queue's next plain claim may start reading its default-priority jobs
    # (job_claim_one's `floor`; workers/claimer.py, Floors); None: it did not say.
    floor: datetime | None = None
    # It emptied its queue's plain line while fair jobs wait there (job_claim_one): claim
    # them in turns (store/fair.sql) at once.
    fair_waiting: bool = False


@dataclass(slots=True)
class ClaimedJob:
    """A job this worker holds the lease of."""

    id: int
    queue: str
    task: str
    args: dict[str, Any]
    idempotency_key: str | None
    priority: int
    attempt: int
    max_attempts: int
    timeout: float | None
    wait: float = 0.0  # seconds from available to claimed (database clock)
    batch_id: int | None = None  # the batch it belongs to
    workflow_id: int | None = None  # the workflow it is a step of


# The `_claimed` fragment's columns (store/fragments.sql), which every claim returns.
_CLAIMED = tuple(f.name for f in fields(ClaimedJob))


def claimed(rows: Iterable[Mapping[str, Any]]) -> list[ClaimedJob]:
    """The claim's rows (read as dicts: dict_row) as ClaimedJob, column by name."""
    jobs = [
        ClaimedJob(**{name: row[name] for name in _CLAIMED})
        for row in rows
        if row["id"] is not None  # job_claim_one's row when it took nothing
    ]
    for job in jobs:
        if not isinstance(job.args, dict):  # jsonb read as text
            job.args = json.loads(job.args)
    return jobs


def next_due(rows: Sequence[Mapping[str, Any]], limit: int) -> tuple[float | None] | None:
    """What job_claim_one's `next_due` column says of the next ready job (Claim.next_due):
    only a claim that took some jobs but fewer than `limit` carries it."""
    taken = sum(row["id"] is not None for row in rows)
    if not taken or taken >= limit or "next_due" not in rows[0]:
        return None
    return (rows[0]["next_due"],)


def claim(rows: Sequence[Mapping[str, Any]], limit: int, completed: set[int]) -> Claim:
    """A plain claim's rows (job_claim_one, job_claim) as a Claim, with the ids its
    transaction `completed`."""
    floor = rows[0]["floor"] if rows and "floor" in rows[0] else None
    fair = bool(rows and rows[0].get("fair_waiting"))
    return Claim(
        claimed(rows),
        completed=completed,
        next_due=next_due(rows, limit),
        floor=floor,
        fair_waiting=fair,
    )


class JobState(enum.StrEnum):
    """The state of a job row (the schema's job_state type)."""

    BLOCKED = "blocked"  # a workflow job waiting for its upstream jobs
    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
