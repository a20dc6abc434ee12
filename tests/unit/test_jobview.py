"""How `jobs list` and `jobs show` word a job's errors: an earlier attempt's error as
that, an operator's retry or cancel as who did it (no database)."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from forklift.admin.rows import JobRow
from forklift.shown.jobview import error_text, operator_action

NOW = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)
JOB = JobRow(
    1, "q", "t", "dead", 0, 2, 2, 0, 2, NOW, NOW, NOW, NOW, None, "RuntimeError: boom", 9.0
)


@pytest.mark.parametrize(
    ("state", "shown"),
    [
        ("dead", "RuntimeError: boom"),
        ("cancelled", "RuntimeError: boom"),
        ("ready", "RuntimeError: boom"),  # waits to be tried again after it
        ("succeeded", "earlier: RuntimeError: boom"),
        ("running", "earlier: RuntimeError: boom"),
    ],
)
def test_a_last_error_is_an_earlier_attempts_once_the_job_went_on(state: str, shown: str) -> None:
    assert error_text(replace(JOB, state=state)) == shown
    assert error_text(replace(JOB, state=state, last_error=None)) == "-"


def entry(error: str, worker: str | None = None, traceback: str | None = None) -> dict[str, object]:
    return {"attempt": 2, "at": NOW.isoformat(), "worker": worker, "error": error,
            "traceback": traceback}  # fmt: skip


def test_an_operators_retry_and_cancel_read_as_what_they_did() -> None:
    at = "2026-12-01 11:00:00Z (0s ago)"
    retried = entry("Retried by op@host: attempts 2 and crashes 1 reset to 0")
    assert operator_action(retried, NOW) == (
        f"  retried by op@host at {at}: attempts 2 and crashes 1 reset to 0"
    )
    assert operator_action(entry("Cancelled by op@host"), NOW) == f"  cancelled by op@host at {at}"
    ran = entry("Cancelled by op@host while it ran", worker="h:1:x")
    assert (
        operator_action(ran, NOW) == f"  cancelled by op@host at {at}, while it ran on worker h:1:x"
    )


@pytest.mark.parametrize(
    "failed",
    [
        entry("RuntimeError: Retried by op@host: no", worker="h:1:x"),
        entry("Retried by op@host: x", traceback="Traceback (most recent call last): ..."),
        entry("Cancelled by op@host since"),
        entry("WorkerLost: killed by SIGKILL"),
    ],
)
def test_a_failed_attempt_is_no_operators_action(failed: dict[str, object]) -> None:
    assert operator_action(failed, NOW) is None
