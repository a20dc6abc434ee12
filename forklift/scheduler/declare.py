"""Declaring schedules: `App.periodic()`'s options, checked at declaration, never at a fire.

A bad cron expression, an unknown time zone, a bad or duplicate schedule name, or
arguments the task cannot take are a ConfigError where the schedule is declared, and
its message starts with the file and line that declare it (`app/jobs.py:12: ...`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from types import FrameType, TracebackType
from typing import Any, ParamSpec, Protocol, TypedDict, TypeVar, overload
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forklift import _display, _job, _names
from forklift._job import JobSpec
from forklift.backoff import Backoff
from forklift.errors import ArgumentError, ConfigError
from forklift.scheduler.fire_times import Cron, Every, FireTimes
from forklift.scheduler.schedule import Schedule
from forklift.task import Task

P = ParamSpec("P")
R = TypeVar("R")


class Declaring(Protocol):
    """What declaring a schedule needs of its app (forklift.App): its tasks, its
    schedules, its bound on arguments, and declaring a task."""

    tasks: dict[str, Task[Any, Any]]
    schedules: dict[str, Schedule]

    @property
    def max_arg_bytes(self) -> int: ...

    def task(
        self,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        max_attempts: int = 5,
        timeout: float | None = None,
        backoff: Backoff | None = None,
    ) -> Callable[[Callable[P, R]], Task[P, R]]: ...


class ScheduleOptions(TypedDict, total=False):
    """When and how a schedule enqueues its task (App.periodic's keywords).

    name: the schedule's name (default: the task's); cron: a cron expression, 5 fields
    or 6 with seconds first; every: an interval (timedelta or seconds, whole seconds),
    aligned to the Unix epoch; tz: the cron expression's time zone (default UTC, never
    the host's); args: the jobs' arguments; queue, priority, max_attempts: the jobs'
    (default: the task's); catchup: after downtime, enqueue every missed fire time
    within this window (default: only the most recent one); overlap: False skips a fire
    while the previous fire's job is still ready or running.
    """

    name: str
    cron: str
    every: timedelta | float
    tz: str
    args: Mapping[str, Any]
    queue: str
    priority: int
    max_attempts: int
    catchup: timedelta | float
    overlap: bool


class PeriodicOptions(ScheduleOptions, total=False):
    """ScheduleOptions plus the options of the task that decorating a function registers
    (task_name, default: the function's name; timeout; backoff)."""

    task_name: str
    timeout: float
    backoff: Backoff


class Periodic:
    """What `@app.periodic(...)` returns: registers the function as a task (or takes a
    Task already registered) and schedules it."""

    def __init__(self, app: Declaring, options: PeriodicOptions) -> None:
        self.app = app
        self.options = options
        try:
            _timing(options)  # a bad expression or zone fails at the decorator's line
        except ConfigError as exc:
            raise _located(exc) from None

    @overload
    def __call__(self, fn: Task[P, R], /) -> Task[P, R]: ...

    @overload
    def __call__(self, fn: Callable[P, R], /) -> Task[P, R]: ...

    def __call__(self, fn: Callable[..., Any], /) -> Task[Any, Any]:
        try:
            return self._scheduled(fn)
        except ConfigError as exc:
            raise _located(exc) from None

    def _scheduled(self, fn: Callable[..., Any]) -> Task[Any, Any]:
        o = self.options
        if isinstance(fn, Task):
            given = sorted({"task_name", "timeout", "backoff"} & o.keys())
            if given:
                raise ConfigError(
                    f"schedule of task {fn.name!r}: {', '.join(given)} belong to @app.task"
                )
            _schedule(self.app, fn, o)
            return fn
        task: Task[Any, Any] = self.app.task(
            name=o.get("task_name"),
            queue=o.get("queue", "default"),
            priority=o.get("priority", 0),
            max_attempts=o.get("max_attempts", 5),
            timeout=o.get("timeout"),
            backoff=o.get("backoff"),
        )(fn)
        try:
            _schedule(self.app, task, o)
        except ConfigError:
            del self.app.tasks[task.name]  # a bad schedule leaves no task behind
            raise
        return task


def schedule(app: Declaring, task: Task[Any, Any] | str, options: ScheduleOptions) -> Schedule:
    """Check `options` for `task` (a Task, or a registered task's name) and add the
    schedule to `app`; ConfigError, located at its caller's line, if anything about it
    is wrong."""
    try:
        return _schedule(app, task, options)
    except ConfigError as exc:
        raise _located(exc) from None


def _located(exc: ConfigError) -> ConfigError:
    """`exc` as the user's code should see it: its message starts with the file and line
    that declare the schedule, and its traceback ends there, so a traceback and the
    one-line error of `forklift run` (which names the innermost frame) both point at the
    user's line, not at the line of forklift's that found the mistake. The frame is the
    innermost one outside forklift's declaring modules, found while it is on the stack."""
    frame = _declaring_frame()
    if frame is None:
        return exc
    where = f"{_display.from_here(frame.f_code.co_filename)}:{frame.f_lineno}"
    found = ConfigError(f"{where}: {exc}")
    return found.with_traceback(TracebackType(None, frame, frame.f_lasti, frame.f_lineno))


def _declaring_frame() -> FrameType | None:
    """The user's frame that declares the schedule: the innermost one that is not
    forklift's declaring code (None only if forklift's own code is all there is)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and _is_declaring(frame):
        frame = frame.f_back
    return frame


def _is_declaring(frame: FrameType) -> bool:
    """Whether `frame` runs forklift's declaring code (App.periodic and this package)."""
    module = str(frame.f_globals.get("__name__", ""))
    return module == "forklift.app" or module.startswith("forklift.scheduler.")


def _schedule(app: Declaring, task: Task[Any, Any] | str, options: ScheduleOptions) -> Schedule:
    """schedule() before its ConfigError is located (Periodic locates its own)."""
    known = _resolve(app, task)
    task_name = known.name if known is not None else str(task)
    name = options.get("name", task_name)
    _check_name("schedule", name)
    if name in app.schedules:
        raise ConfigError(f"two schedules are named {name!r} in this app: give one name=...")
    times, cron, every, tz = _timing(options)
    spec = JobSpec(
        task_name,
        options.get("args", {}),
        queue=options.get("queue"),
        priority=options.get("priority"),
        max_attempts=options.get("max_attempts"),
    )
    try:
        job = _job.build(spec, known, app.max_arg_bytes)
    except ArgumentError as exc:
        raise ConfigError(f"schedule {name!r}: {exc}") from None
    catchup = _seconds(options["catchup"], "catchup") if "catchup" in options else None
    if times.after(datetime.now(UTC)) is None:
        raise ConfigError(f"schedule {name!r}: {cron!r} never fires")
    found = Schedule(
        name=name,
        job=job,
        cron=cron,
        every=every,
        tz=tz,
        catchup=catchup,
        overlap=options.get("overlap", True),
        times=times,
    )
    app.schedules[name] = found
    return found


def _resolve(app: Declaring, task: Task[Any, Any] | str) -> Task[Any, Any] | None:
    """The Task to schedule; None for a name an app with no tasks may enqueue."""
    if isinstance(task, Task):
        return task
    _check_name("task", task)
    known = app.tasks.get(task)
    if known is None and app.tasks:
        raise ConfigError(
            f"cannot schedule {task!r}: no task of that name is registered in this app "
            "(declare the task first)"
        )
    return known


def _timing(options: ScheduleOptions) -> tuple[FireTimes, str | None, int | None, str]:
    """(fire times, cron, every in seconds, zone name) from cron=/every=/tz=."""
    if ("cron" in options) == ("every" in options):
        raise ConfigError("a schedule needs exactly one of cron=... or every=...")
    if "every" in options:
        if "tz" in options:
            raise ConfigError(
                "tz= applies to cron= schedules; every= intervals are aligned to the "
                "Unix epoch (UTC)"
            )
        seconds = _seconds(options["every"], "every")
        if seconds < 1 or seconds != int(seconds):
            raise ConfigError(f"every= must be a whole number of seconds, at least 1: {seconds}")
        return Every(int(seconds)), None, int(seconds), "UTC"
    tz = options.get("tz", "UTC")
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        raise ConfigError(f"unknown time zone {tz!r} (an IANA name, e.g. Europe/Zagreb)") from None
    cron = options["cron"]
    if not isinstance(cron, str) or len(cron.split()) not in (5, 6):
        raise ConfigError(
            f"cron expression {cron!r}: expected 5 fields (minute hour day month weekday), "
            "or 6 with seconds first"
        )
    times = Cron(cron, zone)
    return times, times.expr, None, tz


def _seconds(value: timedelta | float, what: str) -> float:
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    if seconds <= 0:
        raise ConfigError(f"{what}= must be positive, got {seconds} seconds")
    return seconds


def _check_name(kind: str, value: Any) -> None:
    try:
        _names.check(kind, value)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
