"""Run exactly one job's handler and turn whatever happens into a Result."""

from __future__ import annotations

import asyncio
import inspect
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from forklift import _json
from forklift.errors import Fail, Interrupted, ResultError, Retry, Snooze
from forklift.task import Task
from forklift.workers.context import JobContext

_ERROR_CHARS = 2000
_TRACEBACK_CHARS = 8000


@dataclass(frozen=True, slots=True)
class Result:
    """What became of one attempt: succeeded, or failed with an error (maybe dead)."""

    succeeded: bool
    error: str = ""
    traceback: str | None = None
    retry_delay: float | None = None  # asked for by forklift.Retry
    give_up: bool = False  # forklift.Fail, unknown task, bad arguments: no more attempts
    interrupted: bool = False  # forklift.Interrupted: to be given back if the worker stops
    snooze: float | None = None  # forklift.Snooze's seconds: given back to run then, uncounted
    value: str | None = None  # the handler's return value as JSON text (None: none)
    # What the handler raised, for its trace span only (never stored, never compared).
    exception: BaseException | None = field(default=None, compare=False, repr=False)


SUCCEEDED = Result(succeeded=True)


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_ERROR_CHARS]


def format_traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    # Keep the end: the innermost frames say where it broke.
    return text if len(text) <= _TRACEBACK_CHARS else "…" + text[-_TRACEBACK_CHARS:]


def failure(exc: BaseException) -> Result:
    if isinstance(exc, Retry):
        return Result(False, describe(exc), None, retry_delay=exc.delay, exception=exc)
    if isinstance(exc, Interrupted):
        return Result(False, describe(exc), None, interrupted=True, exception=exc)
    if isinstance(exc, Snooze):
        return snoozed(exc)
    if isinstance(exc, Fail):
        return Result(False, describe(exc), format_traceback(exc), give_up=True, exception=exc)
    return Result(False, describe(exc), format_traceback(exc), exception=exc)


def snoozed(snooze: Snooze) -> Result:
    """A run that asked to run again later (raised or returned forklift.Snooze): no
    success (its effect rolls back) and no failure (no attempt spent, no error kept)."""
    return Result(False, describe(snooze), None, snooze=snooze.seconds)


def over_snoozed(snoozes: int, max_snoozes: int) -> Result:
    """A snooze past the task's max_snoozes: a failed attempt, retried or dead as usual."""
    return Result(False, f"Snooze: snoozed {snoozes} times, max_snoozes={max_snoozes}")


def timed_out(task: str, job_id: int, timeout: float) -> str:
    """Why a job that overran its task's timeout ended: the same words whoever ended it
    (the supervisor's kill of a sync handler's process, or the cancel of an async one)."""
    return f"job {task}#{job_id} timed out after {timeout:g} s"


def give_up(error: str) -> Result:
    return Result(False, error[:_ERROR_CHARS], None, give_up=True)


def refusal(task: Task[Any, Any] | None, ctx: JobContext, owner: str) -> Result | None:
    """Why the job's handler is not called (None: it is). A task this worker lacks is a
    failed attempt that retries (during a rolling deploy, producers may know a task
    before every worker does); arguments that do not fit the handler fail the job for
    good."""
    job = ctx.job
    if task is None:
        return Result(
            False, f"UnknownTaskError: no task named {job.task!r} in worker {owner}"[:_ERROR_CHARS]
        )
    problem = task.misfit(job.args)
    if problem is not None:
        return give_up(f"ArgumentError: {job.task}: {problem}")
    return None


@contextmanager
def handler_running(ctx: JobContext) -> Iterator[None]:
    """Tell ctx.on_handler that its handler runs from now until the block ends: as
    close to the call as it gets, so a death is charged to the jobs whose handlers it
    could have been."""
    mark = ctx.on_handler
    if mark is None:
        yield
        return
    mark(True)
    try:
        yield
    finally:
        mark(False)


def run(task: Task[Any, Any] | None, ctx: JobContext, owner: str) -> Result:
    """Run the job's (plain def) handler, unless refused."""
    refused = refusal(task, ctx, owner)
    if refused is not None:
        return refused
    assert task is not None
    with handler_running(ctx):
        return call(task.fn, (ctx,), ctx.job.args, task.app.max_result_bytes)


async def run_async(
    task: Task[Any, Any] | None, ctx: JobContext, owner: str, timeout: float | None
) -> Result:
    """Run the job's async handler on this event loop, unless refused, for at most
    `timeout` seconds: past it the coroutine is cancelled and the attempt ends in a
    TimeoutError, worded as the supervisor words a sync handler's (`timed_out`) —
    however the handler ended once its deadline had passed (it may swallow the
    CancelledError and return, or raise something else): what it did after its
    deadline is no success, and its effect rolls back."""
    refused = refusal(task, ctx, owner)
    if refused is not None:
        return refused
    assert task is not None
    job = ctx.job
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            with handler_running(ctx):
                value = await task.fn(ctx, **job.args)
    except asyncio.CancelledError as exc:  # a cancel (aio.py): its outcome is refused anyway
        running = asyncio.current_task()
        if running is not None:
            running.uncancel()  # handled here: the rest of the job's steps run as usual
        return overran(job.task, job.id, timeout, exc) if deadline.expired() else failure(exc)
    except BaseException as exc:  # a handler's exception never escapes the worker
        # (a TimeoutError before the deadline is the handler's own: an HTTP client's, say)
        return overran(job.task, job.id, timeout, exc) if deadline.expired() else failure(exc)
    if deadline.expired():
        return overran(job.task, job.id, timeout, None)
    return encoded(value, task.app.max_result_bytes)


def overran(task: str, job_id: int, timeout: float | None, exc: BaseException | None) -> Result:
    """An attempt whose deadline passed: a TimeoutError, whatever the handler did after
    it (`exc`: what it raised; None: it returned, an async one swallowing its cancel)."""
    text = f"TimeoutError: {timed_out(task, job_id, timeout or 0)}"
    if exc is None:
        exc = TimeoutError(text.removeprefix("TimeoutError: "))
        return Result(False, text, None, exception=exc)
    return Result(False, text, format_traceback(exc), exception=exc)


def call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any], max_result_bytes: int) -> Result:
    """Call a handler; any exception (even SystemExit) becomes a failed Result. What it
    returns is its result, encoded; one that is not JSON, or too big, is a ResultError
    that ends the job (it would not change on a retry)."""
    try:
        value = fn(*args, **kwargs)
    except BaseException as exc:  # a handler's exception never escapes the worker
        return failure(exc)
    if inspect.isawaitable(value):  # never awaited: nothing it was to do has run
        if inspect.iscoroutine(value):
            value.close()
        return give_up(
            f"TypeError: the handler returned {type(value).__name__} object, which the "
            "worker does not await: its work did not run (declare the handler with "
            "async def to have it awaited)"
        )
    return encoded(value, max_result_bytes)


def encoded(value: Any, max_result_bytes: int) -> Result:
    """A handler's return value as its result (a forklift.Snooze returned: a snooze)."""
    if value is None:
        return SUCCEEDED
    if isinstance(value, Snooze):
        return snoozed(value)
    try:
        return Result(True, value=_json.dumps_result(value, max_result_bytes))
    except ResultError as exc:
        return give_up(describe(exc))
