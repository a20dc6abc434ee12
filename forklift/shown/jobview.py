"""How a job reads: the states it is listed by, its `--json` shapes and its text (arguments
made safe to show), and what an operator's retry or cancel did to it."""

from __future__ import annotations

import json
import re
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forklift import _display
from forklift._redact import redact
from forklift.shown import output
from forklift.unique import STATE_BITS

if TYPE_CHECKING:
    from forklift.admin.rows import Acted, JobDetail, JobRow, Progress

# "scheduled": ready jobs due later (delayed, or retrying after a backoff), as status
# counts them apart; "ready" is every ready job, due or not; "blocked": workflow jobs
# waiting for their upstream jobs.
STATES = ("blocked", "ready", "scheduled", "running", "succeeded", "dead", "cancelled")
ARGS_CHARS = 2000  # of the arguments' (and the result's) JSON text that `jobs show` prints
# Argument keys whose values are never shown, at any depth.
_SECRET = re.compile(r"pass(word|wd)?|secret|token|credential|api_?key|private_?key", re.I)
ERROR_KEYS = ("attempt", "at", "worker", "error", "traceback")

JOB_KEYS = """\
id, queue, task, state (blocked, ready, running, succeeded, dead, cancelled), priority, attempts,
max_attempts, crashes (runs that killed their worker), max_crashes, created_at,
available_at, started_at, completed_at (ISO 8601 UTC, or null), lease_owner (the worker
running it, or null), last_error (or null)"""


def job_json(job: JobRow) -> dict[str, Any]:
    """One job in the `--json` shape of `jobs list` (and the head of `jobs show`'s)."""
    return {
        "id": job.id,
        "queue": job.queue,
        "task": job.task,
        "state": job.state,
        "priority": job.priority,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "crashes": job.crashes,
        "max_crashes": job.max_crashes,
        "created_at": output.utc(job.created_at),
        "available_at": output.utc(job.available_at),
        "started_at": output.utc(job.started_at),
        "completed_at": output.utc(job.completed_at),
        "lease_owner": job.lease_owner,
        "last_error": job.last_error,
    }


# States in which a job's last error is why it is where it is: it went dead or was
# cancelled, or it waits (ready) to be tried again after it. A job that succeeded or runs
# again since carries the error of an earlier attempt, which is shown as that.
ERROR_STATES = frozenset({"dead", "cancelled", "ready"})


def error_text(job: JobRow) -> str:
    """A job's last error for people: `-`, the error, or `earlier: ...` when it is an
    earlier attempt's (the job succeeded, or runs again, since)."""
    if job.last_error is None:
        return "-"
    return job.last_error if job.state in ERROR_STATES else f"earlier: {job.last_error}"


def detail_json(detail: JobDetail) -> dict[str, Any]:
    """One job in the `--json` shape of `jobs show`."""
    args, truncated = safe_args(detail.args)
    return {
        **job_json(detail.job),
        "args": args,
        "args_truncated": truncated,
        "idempotency_key": detail.idempotency_key,
        "timeout_seconds": detail.timeout,
        "lease_until": output.utc(detail.lease_until),
        "errors": [history_entry(e) for e in detail.errors],
        "result": safe_result(detail.result),
        "progress": progress_json(detail.progress),
        "batch_id": detail.batch_id,
        "workflow_id": detail.workflow_id,
        "step": detail.step,
        "waiting_on": detail.waiting_on,
        "upstream_failed": detail.upstream_failed,
        "limit_key": detail.limit_key,
        "worker": worker(detail),
        "leases_forgiven": detail.leases_forgiven,
        "snoozes": detail.snoozes,
        "snoozed_at": output.utc(detail.snoozed_at),
        "unique_key": detail.unique_key,
        "unique_states": unique_states(detail),
        "fair_key": detail.fair_key,
        "fair_weight": detail.fair_weight,
        "fair_turn": detail.fair_turn,
        "requires": None if detail.requires is None else detail.requires.split(","),
    }


def workflow_text(detail: JobDetail) -> str:
    """`jobs show`'s workflow line: the workflow and step, and what the step waits for."""
    if detail.workflow_id is None:
        return "-"
    text = f"{detail.workflow_id}, step {detail.step!r}"
    if detail.job.state == "blocked":
        n = detail.waiting_on
        text += f", waits for {n} upstream job{'s' if n != 1 else ''}"
    if detail.upstream_failed is not None:
        text += f", cancelled: upstream job {detail.upstream_failed} did not succeed"
    return text


def snooze_text(detail: JobDetail) -> str | None:
    """How often the job snoozed and when last (None: never, and nothing is shown)."""
    if not detail.snoozes:
        return None
    return f"{detail.snoozes}, last {output.when(detail.snoozed_at, detail.now)}"


def snooze_lines(detail: JobDetail) -> list[str]:
    """`jobs show`'s snoozes line, for a job that snoozed."""
    text = snooze_text(detail)
    return [] if text is None else [f"  snoozes      {text}"]


def unique_states(detail: JobDetail) -> list[str] | None:
    """The states in which a unique job holds its key (None: not a unique job)."""
    if detail.unique_states is None:
        return None
    return [name for name, bit in STATE_BITS.items() if detail.unique_states & bit]


def unique_lines(detail: JobDetail) -> list[str]:
    """`jobs show`'s unique key line, for a unique job: the key, and the states in which
    it holds it."""
    if detail.unique_key is None:
        return []
    states = ", ".join(unique_states(detail) or [])
    return [f"  unique key   {_display.line(detail.unique_key)} (held while {states})"]


def fair_text(detail: JobDetail) -> str | None:
    """A fair task's job's key, weight and turn (None: not a fair task's job)."""
    if detail.fair_key is None:
        return None
    weight = "" if detail.fair_weight is None else f", weight {detail.fair_weight:g}"
    turn = "" if detail.fair_turn is None else f", turn {detail.fair_turn:g}"
    if detail.fair_turn is None and detail.job.state == "ready":
        turn = ", no turn (due later: it joins the line as it falls due)"
    return f"{detail.fair_key}{weight}{turn}"


def fair_lines(detail: JobDetail) -> list[str]:
    """`jobs show`'s fair key line, for a fair task's job."""
    text = fair_text(detail)
    return [] if text is None else [f"  fair key     {_display.line(text)}"]


def requires_text(detail: JobDetail) -> str | None:
    """The labels a worker must have to run the job (None: any worker may)."""
    return None if detail.requires is None else detail.requires.replace(",", ", ")


def requires_lines(detail: JobDetail) -> list[str]:
    """`jobs show`'s requires line, for a job whose task requires labels."""
    text = requires_text(detail)
    return [] if text is None else [f"  requires     {_display.line(text)} (forklift run --labels)"]


def _forgiven_text(detail: JobDetail) -> str:
    """What `attempts` owes to lost leases forgiven, if anything."""
    n = detail.leases_forgiven
    if not n:
        return ""
    return f" ({n} added: {'a lease' if n == 1 else 'leases'} lost before its handler ran)"


def worker(detail: JobDetail) -> str | None:
    """The worker that runs the job, or ran its last attempt: its lease's owner while it
    runs, the one whose attempt succeeded, else the last attempt's in its history (None:
    it never ran)."""
    if detail.job.lease_owner is not None:
        return detail.job.lease_owner
    if detail.ran_by is not None:
        return detail.ran_by
    for entry in reversed(detail.errors):
        if "attempt" in entry and entry.get("worker"):
            return str(entry["worker"])
    return None


def progress_json(progress: Progress | None) -> dict[str, Any] | None:
    """A job's last progress in the `--json` shapes (`jobs show`, `top`)."""
    if progress is None:
        return None
    return {
        "done": progress.done,
        "total": progress.total,
        "message": progress.message,
        "at": output.utc(progress.at),
    }


def progress_text(progress: Progress | None, now: datetime) -> str:
    """A job's last progress for people: `12/300 (4%): resizing (reported 3s ago)`."""
    if progress is None:
        return "-"
    text = output.fraction(progress.done, progress.total)
    if progress.message:
        text += f": {progress.message}"
    if progress.at is not None:
        text += f" (reported {output.age(max(0.0, (now - progress.at).total_seconds()))} ago)"
    return text


def history_entry(entry: dict[str, Any]) -> dict[str, Any]:
    """One attempt of the error history, every key present, DSN passwords hidden."""
    shown = {k: entry.get(k) for k in ERROR_KEYS}
    return {k: redact(v) if isinstance(v, str) else v for k, v in shown.items()}


def safe_args(text: str, limit: int = ARGS_CHARS) -> tuple[str, bool]:
    """The arguments' JSON text with secret-looking values and DSN passwords hidden,
    cut to `limit` characters: (text, whether it was cut)."""
    try:
        shown = json.dumps(_masked(json.loads(text)), ensure_ascii=False)
    except ValueError:
        shown = text
    shown = redact(shown)
    if len(shown) <= limit:
        return shown, False
    return shown[: limit - 1] + "…", True


def safe_result(text: str | None) -> Any:
    """A job's result (JSON text, as stored) as a value, whole, with the values of
    secret-looking keys and DSN passwords hidden as in the arguments; None: none."""
    if text is None:
        return None
    try:
        return _masked(json.loads(text))
    except ValueError:
        return redact(text)


def _masked(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: "***" if isinstance(k, str) and _SECRET.search(k) else _masked(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_masked(v) for v in value]
    if isinstance(value, str):
        return redact(value)
    return value


def _result_text(text: str | None) -> str:
    if text is None:
        return "-"
    result, truncated = safe_args(text)
    return _display.line(result) + (" (truncated)" if truncated else "")


def history_time(stamp: Any, now: datetime) -> str:
    """An error history entry's time (ISO text, as jsonb keeps it) as people read it."""
    try:
        return output.when(datetime.fromisoformat(str(stamp)), now)
    except ValueError:
        return str(stamp)


# What admin/jobs.sql writes into the error history for an operator's retry and cancel.
# A handler's error never reads so: it starts with its exception's type name.
_OPERATOR = re.compile(r"(Retried|Cancelled) by (\S+?)(?:: (.*)| (while it ran))?", re.DOTALL)


def operator_action(entry: dict[str, Any], now: datetime) -> str | None:
    """An error history entry that records an operator's retry or cancel, as one line
    (`  retried by op@host at ...: attempts 2 and crashes 0 reset to 0`); None for an
    attempt that failed."""
    match = _OPERATOR.fullmatch(str(entry.get("error") or ""))
    if match is None or entry.get("traceback"):
        return None
    verb, by, detail, ran = match.groups()
    text = f"  {verb.lower()} by {by} at {history_time(entry['at'], now)}"
    if detail:
        text += f": {detail}"
    if ran and entry.get("worker"):
        text += f", while it ran on worker {entry['worker']}"
    return text


def print_detail(detail: JobDetail) -> None:
    """`forklift jobs show` for people: the job, then its whole error history. Every
    value is escaped (`_display.line`): each field stays on its line, and a traceback's
    lines stay lines of its indented block."""
    job, now = detail.job, detail.now
    args, truncated = safe_args(detail.args)
    shown = _display.line
    lines = [
        f"job {job.id}: {shown(job.task)} in queue {shown(job.queue)}, {job.state}",
        f"  attempts     {job.attempts} of {job.max_attempts}{_forgiven_text(detail)}",
        f"  crashes      {job.crashes} of {job.max_crashes}",
        *snooze_lines(detail),
        f"  priority     {job.priority}",
        f"  key          {shown(detail.idempotency_key or '-')}",
        *unique_lines(detail),
        f"  args         {shown(args)}{' (truncated)' if truncated else ''}",
        f"  result       {_result_text(detail.result)}",
        f"  progress     {shown(progress_text(detail.progress, now))}",
        f"  batch        {'-' if detail.batch_id is None else detail.batch_id}",
        f"  workflow     {shown(workflow_text(detail))}",
        f"  limit key    {shown(detail.limit_key or '-')}",
        *fair_lines(detail),
        *requires_lines(detail),
        f"  timeout      {'-' if detail.timeout is None else f'{detail.timeout:g} s'}",
        f"  enqueued     {output.when(job.created_at, now)}",
        f"  available    {output.when(job.available_at, now)}",
        f"  started      {output.when(job.started_at, now)}",
        f"  completed    {output.when(job.completed_at, now)}",
        f"  worker       {shown(worker(detail) or '-')}",
        f"  lease until  {output.when(detail.lease_until, now)}",
        f"  last error   {shown(error_text(job))}",
        f"errors ({len(detail.errors)}, oldest first):" if detail.errors else "errors: none",
    ]
    for entry in map(history_entry, detail.errors):
        action = operator_action(entry, now)
        if action is not None:
            lines.append(shown(action))
            continue
        lines.append(
            shown(
                f"  attempt {entry['attempt']} at {history_time(entry['at'], now)} "
                f"on worker {entry['worker'] or '-'}"
            )
        )
        lines.append(f"    {shown(entry.get('error'))}")
        traceback = entry.get("traceback")
        if traceback:
            block = _display.block(str(traceback).rstrip())
            lines += [f"      {line}" for line in block.split("\n")]
    print("\n".join(lines))


def retry_line(a: Acted) -> str:
    if a.was is None:
        return f"job {a.id}: not retried: no such job"
    if a.became == "cancelled":
        return (
            f"job {a.id}: not retried: an upstream job of its workflow is still dead or "
            "cancelled (`forklift jobs show` names it): retry that one, and this one "
            "comes back with it"
        )
    if a.held_by is not None and not a.done:
        return (
            f"job {a.id}: not retried: job {a.held_by} holds its unique key now (a retry "
            "would make a second live job of it)"
        )
    if not a.done:
        return f"job {a.id}: not retried: it is {a.was} (only dead and cancelled jobs are)"
    now = "blocked until its upstream jobs succeed" if a.became == "blocked" else "ready now"
    return (
        f"job {a.id}: retried (was {a.was}): {now}, attempts {a.attempts} -> 0, "
        f"crashes {a.crashes} -> 0"
    )


def cancel_line(a: Acted) -> str:
    if a.was is None:
        return f"job {a.id}: not cancelled: no such job"
    if not a.done:
        return (
            f"job {a.id}: not cancelled: it is {a.was} (only blocked, ready and running jobs are)"
        )
    if a.was != "running":
        return f"job {a.id}: cancelled (was {a.was})"
    return (
        f"job {a.id}: cancelled (was running on {a.owner}): its worker is told to stop, "
        "and killed if its handler has not returned within --cancel-grace"
    )
