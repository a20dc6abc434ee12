"""Helpers for testing: an app's own tests of its tasks, and tests that run forklift.

For an app's tests (no supervisor, no worker fleet):

- `inline(app)`: in its block, every job enqueued runs at once in the caller's thread,
  with a real JobContext, and writes no row (a unit test; see its docstring for what it
  does not do). `run_job(task, args)` calls one handler once.
- `drain(app)`: a real worker, in this process, runs the due jobs until none is left
  (an integration test on a real database); `Drained` says how each attempt ended.
- `enqueued`, `assert_enqueued`, `refute_enqueued`: the jobs waiting in the jobs table.

For tests that run forklift's processes (processes.py): `ForkliftProcess`, `wait_for`,
`WaitTimedOut` and the /proc helpers. Those load no database driver: the helpers above
are imported on first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forklift.testing.processes import (
    ForkliftProcess,
    WaitTimedOut,
    calls_handler,
    child_pids,
    process_state,
    process_title,
    session_pids,
    wait_for,
)

if TYPE_CHECKING:
    from forklift.testing._drain import drain
    from forklift.testing._enqueued import assert_enqueued, enqueued, refute_enqueued
    from forklift.testing._inline import Inline, inline, run_job
    from forklift.testing._results import (
        Drained,
        DrainTimedOut,
        HandlerFailed,
        InlineUnsupported,
        Ran,
    )
    from forklift.testing._store import EnqueuedJob

_LAZY = {
    "Drained": "forklift.testing._results",
    "DrainTimedOut": "forklift.testing._results",
    "EnqueuedJob": "forklift.testing._store",
    "HandlerFailed": "forklift.testing._results",
    "Inline": "forklift.testing._inline",
    "InlineUnsupported": "forklift.testing._results",
    "Ran": "forklift.testing._results",
    "assert_enqueued": "forklift.testing._enqueued",
    "drain": "forklift.testing._drain",
    "enqueued": "forklift.testing._enqueued",
    "inline": "forklift.testing._inline",
    "refute_enqueued": "forklift.testing._enqueued",
    "run_job": "forklift.testing._inline",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forklift.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "DrainTimedOut",
    "Drained",
    "EnqueuedJob",
    "ForkliftProcess",
    "HandlerFailed",
    "Inline",
    "InlineUnsupported",
    "Ran",
    "WaitTimedOut",
    "assert_enqueued",
    "calls_handler",
    "child_pids",
    "drain",
    "enqueued",
    "inline",
    "process_state",
    "process_title",
    "refute_enqueued",
    "run_job",
    "session_pids",
    "wait_for",
]
