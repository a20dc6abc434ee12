"""One job to enqueue: its options (JobOptions, JobSpec), checked once, and the row that
every producer writes from them (build): enqueue, enqueue_many, their async twins, batches
and their callbacks, and schedules."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol, TypedDict

from forklift import _json, _names
from forklift.errors import ArgumentError, ConfigError
from forklift.store._rows import NewJob
from forklift.unique import ON_CONFLICT, OnConflict, Unique

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
    unique: Unique | Literal[False] | None
    on_conflict: OnConflict | None


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
    # Unique by this declaration (forklift.Unique) instead of its task's; False: not unique.
    unique: Unique | Literal[False] | None = None
    # When a live job holds its unique key: "keep" it (the default), "replace" its
    # arguments and due time if it is still ready, or "raise" UniqueConflict.
    on_conflict: OnConflict | None = None


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
    @property
    def unique(self) -> Unique | None: ...
    def unique_key(self, task: str, args: Mapping[str, Any], unique: Unique) -> str: ...
    def fair_of(self, args: Mapping[str, Any]) -> tuple[str | None, float | None]: ...
    @property
    def requires(self) -> tuple[str, ...]: ...


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

    @property
    def unique(self) -> Unique | None:
        return None

    def unique_key(self, task: str, args: Mapping[str, Any], unique: Unique) -> str:
        return unique.key_of(task, args, {})

    def fair_of(self, args: Mapping[str, Any]) -> tuple[str | None, float | None]:
        return None, None

    @property
    def requires(self) -> tuple[str, ...]:
        return ()


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
    fair_key, fair_weight = defaults.fair_of(args)
    unique = _unique(spec, defaults)
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
        fair_key=fair_key,
        fair_weight=fair_weight,
        unique_key=None if unique is None else defaults.unique_key(spec.task, args, unique),
        unique_period=None if unique is None else unique.period,
        unique_states=None if unique is None else unique.mask,
        on_conflict=spec.on_conflict or "keep",
        requires=",".join(defaults.requires) or None,
    )


def _unique(spec: JobSpec, defaults: TaskDefaults) -> Unique | None:
    """How `spec`'s job is unique (None: it is not), its options checked (ArgumentError)."""
    if spec.unique is None:
        unique = defaults.unique
    elif spec.unique is False or isinstance(spec.unique, Unique):
        unique = spec.unique or None
    else:
        raise ArgumentError(f"unique is a forklift.Unique or False, got {spec.unique!r}")
    if spec.on_conflict is None:
        return unique
    if spec.on_conflict not in ON_CONFLICT:
        raise ArgumentError(
            f"on_conflict is 'keep', 'replace' or 'raise', got {spec.on_conflict!r}"
        )
    if unique is None:
        raise ArgumentError(
            f"on_conflict={spec.on_conflict!r} is for unique jobs: task {spec.task!r} is not "
            "declared unique, and this enqueue gives no unique=forklift.Unique(...)"
        )
    if spec.on_conflict == "replace" and spec.idempotency_key is not None:
        raise ArgumentError(
            "on_conflict='replace' takes no idempotency_key: a key promises its job as "
            "enqueued, which a replace would change"
        )
    return unique


def _seconds(delay: float | timedelta | None) -> float:
    if delay is None:
        return 0.0
    seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
    if seconds < 0:
        raise ArgumentError(f"delay must be >= 0 seconds, got {seconds}")
    return seconds
