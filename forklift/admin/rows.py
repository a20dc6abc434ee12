"""The rows the operator's job store gives: jobs as listed and shown, and what an action did."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass(frozen=True)
class Progress:
    """How far a running job said it is (ctx.progress): `done` of `total` (None: not
    known), a message, and when the worker wrote it."""

    done: float
    total: float | None
    message: str | None
    at: datetime | None

    @classmethod
    def of(cls, value: Any) -> Progress | None:
        """The progress a job's `progress` column holds; None when it holds none, or
        nothing that reads as one (the column is JSON: anyone may have written it)."""
        if not isinstance(value, dict) or not _number(value.get("done")):
            return None
        total, message, at = value.get("total"), value.get("message"), value.get("at")
        try:
            when = datetime.fromisoformat(at) if isinstance(at, str) else None
        except ValueError:
            when = None
        if when is not None and when.tzinfo is None:
            when = when.replace(tzinfo=UTC)  # jsonb's now() has its offset; this was by hand
        return cls(
            value["done"],
            total if _number(total) else None,
            None if message is None else str(message),
            when,
        )

    @property
    def percent(self) -> float | None:
        """`done` of `total` in percent; None when the total is not known (or 0)."""
        if self.total is None or self.total <= 0:
            return None
        return 100.0 * self.done / self.total


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


@dataclass(frozen=True)
class Checkpoint:
    """Where a resumable job's next attempt starts (migration 0018): the document its
    worker last wrote, whole (`document`), and when (`at`); what an operator reads of it
    (the cursors, the names of the steps done, the handler's state) taken from it as far
    as it holds them (anyone may have written the column)."""

    document: Any
    at: datetime | None

    @classmethod
    def of(cls, value: Any, at: datetime | None) -> Checkpoint | None:
        """The checkpoint a job's `checkpoint` column holds; None when it holds none."""
        return None if value is None else cls(value, at)

    def _part(self, key: str) -> Any:
        return self.document.get(key) if isinstance(self.document, dict) else None

    @property
    def version(self) -> int | None:
        v = self._part("v")
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def state(self) -> Any:
        """The handler's own state (None: it kept none)."""
        return self._part("state")

    @property
    def cursors(self) -> dict[str, Any]:
        """Each loop's cursor, by the loop's name (ctx.iterate)."""
        cursors = self._part("cursors")
        return cursors if isinstance(cursors, dict) else {}

    @property
    def steps(self) -> list[str]:
        """The names of the steps done (ctx.step), by name (jsonb keeps no order)."""
        steps = self._part("steps")
        return sorted(str(name) for name in steps) if isinstance(steps, dict) else []

    @property
    def ran(self) -> float | None:
        """Seconds of work it stands for (None: not said)."""
        ran = self._part("ran")
        return float(ran) if _number(ran) else None


@dataclass(frozen=True)
class JobFilter:
    """Which jobs `forklift jobs list` looks for; None matches any."""

    state: str | None = None  # a job state, or "scheduled": ready and due later
    queue: str | None = None
    task: str | None = None
    error: str | None = None  # a piece of the last error, any case

    @property
    def pattern(self) -> str | None:
        """`error` as an ILIKE pattern that matches it anywhere, taken literally."""
        if self.error is None:
            return None
        escaped = self.error.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        return f"%{escaped}%"


@dataclass(frozen=True)
class JobRow:
    """One job, as `forklift jobs list` shows it."""

    id: int
    queue: str
    task: str
    state: str
    priority: int
    attempts: int
    max_attempts: int
    crashes: int
    max_crashes: int
    created_at: datetime
    available_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    lease_owner: str | None
    last_error: str | None
    age: float  # seconds since it was enqueued (database clock)


@dataclass(frozen=True)
class JobPage:
    """A page of jobs, newest first; `next_before` is where the next page starts (the
    id to pass as --before), None when nothing older is left to look at."""

    jobs: list[JobRow]
    next_before: int | None


@dataclass(frozen=True)
class JobDetail:
    """One job, everything `forklift jobs show` tells of it."""

    job: JobRow
    args: str  # the arguments as JSON text, as stored
    idempotency_key: str | None
    timeout: float | None
    lease_until: datetime | None
    errors: list[dict[str, Any]]  # attempt, at, worker, error (and traceback), oldest first
    now: datetime  # the database's clock when it was read
    result: str | None = None  # the handler's return value as JSON text; None: none
    progress: Progress | None = None  # the last it reported
    batch_id: int | None = None
    limit_key: str | None = None  # its task limit's key value (Limit(key=...))
    ran_by: str | None = None  # the worker whose attempt succeeded (None: none did)
    # Attempts added to max_attempts for leases lost before its handler was seen running.
    leases_forgiven: int = 0
    checkpoint: Checkpoint | None = None  # where its next attempt resumes; None: none
    workflow_id: int | None = None  # the workflow it is a step of, its name there, how many
    step: str | None = None  # of its upstream jobs it still waits for, and the upstream
    waiting_on: int = 0  # job whose failure cancelled it (None: none did)
    upstream_failed: int | None = None
    snoozes: int = 0  # runs that snoozed (forklift.Snooze): not counted as attempts
    snoozed_at: datetime | None = None  # when it last snoozed (None: never)
    unique_key: str | None = None  # a unique job's key (forklift/unique.py; None: not one)
    unique_states: int | None = None  # and the states it holds the key in (a bitmask)
    fair_key: str | None = None  # a fair task's job (forklift/fair.py): its key, its
    fair_weight: float | None = None  # weight (None: 1), its turn while it waits due
    fair_turn: float | None = None  # (None: due later, or not waiting)
    requires: str | None = None  # the labels a worker must have to run it, comma-joined


@dataclass(frozen=True)
class Acted:
    """What an operator's action did to one job it named."""

    id: int
    done: bool  # retried / cancelled
    was: str | None  # its state before; None: there is no such job
    attempts: int = 0  # before a retry reset them
    crashes: int = 0
    owner: str | None = None  # the worker that ran it, when a running job was cancelled
    # A retried job's checkpoint: "kept" (it resumes), "cleared" (--from-scratch); None:
    # it had none (or was not retried).
    checkpoint: str | None = None
    # A retried job's state after: ready; blocked (a workflow step waiting for its
    # upstream jobs); cancelled (one it needs is still dead or cancelled: not retried).
    became: str | None = None
    # A unique job not retried: the live job that holds its key now (None: none does).
    held_by: int | None = None

    @property
    def checkpoint_note(self) -> str:
        """What a retry did to the job's checkpoint, worded to follow the line that says
        it was retried (empty: it had none)."""
        if self.checkpoint == "kept":
            return ", resumes from its checkpoint"
        if self.checkpoint == "cleared":
            return ", checkpoint cleared: starts from scratch"
        return ""


@dataclass(frozen=True)
class Purged:
    """What a purge did (or, in a dry run, would do)."""

    state: str
    cutoff: datetime
    jobs: int
    batches: int = 0
    capped: bool = False  # a dry run stopped counting at its cap
    more: bool = False  # it stopped at its most batches: older jobs may be left


@dataclass(frozen=True)
class RunningJobRow:
    """A job some worker is running, for `forklift top`."""

    id: int
    queue: str
    task: str
    owner: str
    attempt: int
    running_for: float
    progress: Progress | None = None  # the last it reported
    checkpoint_age: float | None = None  # seconds since its checkpoint was written; None: none


@dataclass(frozen=True)
class DeadJob:
    """A job that went dead, for `forklift top`'s recent failures."""

    id: int
    queue: str
    task: str
    ago: float
    error: str | None


@dataclass(frozen=True)
class FinishedMinute:
    """How many jobs succeeded and went dead in one minute (the dashboard's charts)."""

    at: datetime  # the minute's start
    succeeded: int
    dead: int


@dataclass(frozen=True)
class LimitRow:
    """A limit in force: a task's (declared in code, written by its workers) or a
    queue's (`forklift queues limit`)."""

    scope: str  # "task" or "queue"
    name: str
    concurrency: int | None
    rate: int | None
    per: float | None  # seconds; set exactly when `rate` is
    keyed: bool = False
    key_arg: str | None = None
    max_depth: int | None = None
    rejected: int = 0  # enqueues refused by max_depth

    def describe(self) -> str:
        """`concurrency 4, 10/1s per account` for a task, `…, max depth 10000` for a
        queue."""
        return limit_text(
            self.concurrency, self.rate, self.per, self.max_depth,
            (self.key_arg or "key") if self.keyed else None,
        )  # fmt: skip


def limit_text(
    concurrency: int | None,
    rate: int | None,
    per: float | None,
    max_depth: int | None = None,
    key: str | None = None,
) -> str:
    """Limits as people read them: `concurrency 4, 10/1s, max depth 10000`, `per KEY`
    after what is counted per key; empty when there are none."""
    parts = []
    if concurrency is not None:
        parts.append(f"concurrency {concurrency}")
    if rate is not None and per is not None:
        parts.append(f"{rate}/{per:g}s")
    text = ", ".join(parts)
    if text and key is not None:
        text += f" per {key}"
    if max_depth is not None:
        text += f"{', ' if text else ''}max depth {max_depth}"
    return text


@dataclass(frozen=True)
class LimitChange:
    """What `forklift queues limit Q` sets: each limit named in `given` takes its value
    here (None removes it); the others keep theirs."""

    given: frozenset[str]  # of "concurrency", "rate" (with per), "max_depth"
    concurrency: int | None = None
    rate: int | None = None
    per: float | None = None
    max_depth: int | None = None

    def params(self, queue: str) -> dict[str, Any]:
        """queue_limit_set's parameters: a limit not given is NULL in a new row."""
        keep = {
            "concurrency": self.concurrency if "concurrency" in self.given else None,
            "rate": self.rate if "rate" in self.given else None,
            "per": self.per if "rate" in self.given and self.rate is not None else None,
            "max_depth": self.max_depth if "max_depth" in self.given else None,
        }
        given = {f"set_{name}": name in self.given for name in ("concurrency", "rate", "max_depth")}
        return {"queue": queue, **keep, **given}
