"""One job to enqueue: its options (JobOptions, JobSpec), checked once, and the row that
every producer writes from them (build): enqueue, enqueue_many, their async twins, batches
and their callbacks, and schedules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypedDict

from forklift import _json, _names
from forklift.errors import ArgumentError, ConfigError
from forklift.store._rows import NewJob

MAX_ARG_BYTES = _json.MAX_ARG_BYTES


class JobOptions(TypedDict, total=False):
    """How one job is enqueued, besides its task and arguments (JobSpec's fields)."""

    idempotency_key: str | None
    run_at: datetime | None
    delay: float | timedelta | None
    priority: int | None
    queue: str | None
    max_attempts: int | None
    max_crashes: int | None


@dataclass(frozen=True)
class JobSpec:
    """One job for App.enqueue_many(); every way to enqueue builds one."""

    task: str
    args: Mapping[str, Any]
    idempotency_key: str | None = None
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    priority: int | None = None
    queue: str | None = None
    max_attempts: int | None = None
    max_crashes: int | None = None  # runs that may kill their worker (the task's: default)


class TaskDefaults(Protocol):
    """What a declared task (forklift.Task) gives the jobs that do not say otherwise, and
    its check of their arguments."""

    @property
    def queue(self) -> str: ...
    @property
    def priority(self) -> int: ...
    @property
    def max_attempts(self) -> int: ...
    @property
    def max_crashes(self) -> int: ...
    @property
    def timeout(self) -> float | None: ...
    def check_args(self, args: Mapping[str, Any]) -> None: ...
    def limit_key(self, args: Mapping[str, Any]) -> str | None: ...


@dataclass(frozen=True)
class Undeclared:
    """The defaults of a job whose task this app does not declare (a producer-only app
    enqueues by name): any arguments, no limit."""

    queue: str = "default"
    priority: int = 0
    max_attempts: int = 5
    max_crashes: int = 2
    timeout: float | None = None

    def check_args(self, args: Mapping[str, Any]) -> None:
        pass

    def limit_key(self, args: Mapping[str, Any]) -> str | None:
        return None


UNDECLARED = Undeclared()


def check_priority(priority: int) -> None:
    if not -32768 <= priority <= 32767:
        raise ConfigError(f"priority must be between -32768 and 32767, got {priority}")


def build(spec: JobSpec, task: TaskDefaults | None, max_arg_bytes: int = MAX_ARG_BYTES) -> NewJob:
    """The row `spec` is inserted as, validated (ArgumentError; ConfigError for a
    priority out of range): `task` is the app's task of that name, whose defaults fill
    what `spec` leaves out (None: a producer-only app's job, with forklift's)."""
    defaults = UNDECLARED if task is None else task
    args = {} if spec.args is None else spec.args
    text = _json.dumps_args(args, max_arg_bytes)
    defaults.check_args(args)
    try:
        if spec.queue is not None:
            _names.check("queue", spec.queue)
        if spec.idempotency_key is not None:
            _names.check_key(spec.idempotency_key)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    if spec.run_at is not None and spec.run_at.tzinfo is None:
        raise ArgumentError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
    if spec.priority is not None:
        check_priority(spec.priority)
    if spec.max_attempts is not None and spec.max_attempts < 1:
        raise ArgumentError("max_attempts must be >= 1")
    if spec.max_crashes is not None and spec.max_crashes < 1:
        raise ArgumentError("max_crashes must be >= 1")
    return NewJob(
        spec.task,
        text,
        spec.queue or defaults.queue,
        defaults.priority if spec.priority is None else spec.priority,
        spec.max_attempts or defaults.max_attempts,
        defaults.timeout,
        spec.idempotency_key,
        spec.run_at,
        _seconds(spec.delay),
        spec.max_crashes or defaults.max_crashes,
        limit_key=defaults.limit_key(args),
    )


def _seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if seconds < 0:
        raise ArgumentError(f"delay must be >= 0 seconds, got {seconds}")
    return seconds
