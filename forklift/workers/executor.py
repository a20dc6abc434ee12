"""Run exactly one job's handler and turn whatever happens into an Outcome."""

from __future__ import annotations

import traceback
from dataclasses import dataclass
from typing import Any

from forklift.errors import Fail, Retry

_ERROR_CHARS = 2000
_TRACEBACK_CHARS = 8000


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one attempt: succeeded, or failed with an error (maybe dead)."""

    succeeded: bool
    error: str = ""
    traceback: str | None = None
    retry_delay: float | None = None  # asked for by forklift.Retry
    give_up: bool = False  # forklift.Fail, unknown task, bad arguments: no more attempts


SUCCEEDED = Outcome(succeeded=True)


def describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:_ERROR_CHARS]


def format_traceback(exc: BaseException) -> str:
    text = "".join(traceback.format_exception(exc))
    # Keep the end: the innermost frames say where it broke.
    return text if len(text) <= _TRACEBACK_CHARS else "…" + text[-_TRACEBACK_CHARS:]


def failure(exc: BaseException) -> Outcome:
    if isinstance(exc, Retry):
        return Outcome(False, describe(exc), None, retry_delay=exc.delay)
    if isinstance(exc, Fail):
        return Outcome(False, describe(exc), format_traceback(exc), give_up=True)
    return Outcome(False, describe(exc), format_traceback(exc))


def give_up(error: str) -> Outcome:
    return Outcome(False, error[:_ERROR_CHARS], None, give_up=True)


def call(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Outcome:
    """Call a handler; any exception (even SystemExit) becomes a failed Outcome."""
    try:
        fn(*args, **kwargs)
    except BaseException as exc:  # a handler's exception never escapes the worker
        return failure(exc)
    return SUCCEEDED
