"""The rows the job store takes and gives: a job to insert, a job claimed, job states."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from datetime import datetime
from typing import Any


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

    @property
    def due_now(self) -> bool:
        return self.run_at is None and self.delay <= 0


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


class JobState(enum.StrEnum):
    """The state of a job row (the schema's job_state type)."""

    READY = "ready"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    DEAD = "dead"
    CANCELLED = "cancelled"
