"""How a batch reads: its `--json` shapes, its rate, ETA and callback as text, and what
cancelling it did."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from forklift.shown import jobview, output

if TYPE_CHECKING:
    from forklift.admin.batches import BatchCancelled, BatchDetail, BatchSummary


def batch_json(s: BatchSummary) -> dict[str, Any]:
    """One batch in the `--json` shape of `batches list` (and the head of `show`'s)."""
    row = s.row
    return {
        "id": row.id, "state": s.state, "outcome": row.outcome, "total": row.total,
        "ready": s.count("ready"), "running": s.count("running"),
        "succeeded": s.count("succeeded"), "dead": s.count("dead"),
        "cancelled": s.count("cancelled"), "pending": s.pending, "done": s.done,
        "percent": s.percent, "rate_per_second": s.rate, "eta_seconds": s.eta,
        "age_seconds": s.age, "created_at": output.utc(row.created_at),
        "sealed_at": output.utc(row.sealed_at), "cancelled_at": output.utc(row.cancelled_at),
        "finished_at": output.utc(row.finished_at),
        "abandoned_at": output.utc(row.abandoned_at), "cancelled_by": row.cancelled_by,
        "callback_task": row.callback_task, "callback_job_id": row.callback_job_id,
        "callback_state": row.callback_state,
    }  # fmt: skip


def detail_json(d: BatchDetail) -> dict[str, Any]:
    """One batch in the `--json` shape of `batches show`."""
    return {
        **batch_json(d.summary),
        "running_progress_done": d.summary.counts.progress_done,
        "running_progress_total": d.summary.counts.progress_total,
        "last_ended_at": output.utc(d.summary.counts.last_ended),
        "callback": callback_json(d.callback),
        "callback_job": None if d.callback_job is None else jobview.job_json(d.callback_job.job),
        "dead_jobs": [{"id": i, "last_error": e} for i, e in d.dead],
    }


def callback_json(text: str | None) -> dict[str, Any] | None:
    """The callback as its batch keeps it, its arguments made safe as a job's are."""
    spec = jobview.safe_result(text)
    if not isinstance(spec, dict):
        return None if spec is None else {"raw": spec}
    return {**spec, "args": jobview.safe_args(json.dumps(spec.get("args")))[0]}


def rate(s: BatchSummary) -> str:
    return "-" if s.rate is None else f"{output.number(s.rate)}/s"


def eta(s: BatchSummary) -> str:
    return "-" if s.eta is None else output.age(s.eta)


def callback_cell(s: BatchSummary) -> str:
    """Its callback's task, and once enqueued `#job-id state`."""
    row = s.row
    if row.callback_task is None:
        return "-"
    if row.callback_job_id is None:
        return row.callback_task
    return f"{row.callback_task} #{row.callback_job_id} {row.callback_state or 'pruned'}"


def cancel_json(batch_id: int, done: BatchCancelled) -> dict[str, Any]:
    result = "finished" if done.refused else "cancelled" if done.marked else "already_cancelled"
    row = done.after.row
    return {
        "id": batch_id, "result": result, "cancelled_ready": done.cancelled("ready"),
        "cancelled_running": done.cancelled("running"),
        "not_cancelled": sum(1 for a in done.jobs if not a.done), "state": done.after.state,
        "outcome": row.outcome, "cancelled_by": row.cancelled_by,
        "callback_job_id": row.callback_job_id,
    }  # fmt: skip


def cancel_text(batch_id: int, done: BatchCancelled) -> str:
    after, row = done.after, done.after.row
    if done.refused:
        return (
            f"batch {batch_id}: not cancelled: it finished already ({row.outcome}, "
            f"{output.when(row.finished_at, row.now)}); nothing was cancelled"
        )
    head = f"batch {batch_id}: cancelled by {row.cancelled_by}"
    if not done.marked:
        head = f"batch {batch_id}: was cancelled already by {row.cancelled_by}"
    ready, running = done.cancelled("ready"), done.cancelled("running")
    jobs = "job" if ready + running == 1 else "jobs"
    text = f"{head}; {ready} ready and {running} running {jobs} cancelled"
    if running:
        text += (
            " (its worker is told to stop)" if running == 1 else " (their workers are told to stop)"
        )
    if late := sum(1 for a in done.jobs if not a.done):
        text += f"; {late} ended before {'it' if late == 1 else 'they'} could be"
    if after.state == "finished":
        text += f"; it finished ({row.outcome})"
        if row.callback_job_id is not None:
            text += f", its callback {row.callback_task} enqueued as job {row.callback_job_id}"
    else:
        text += f"; {output.plural(after.pending, 'job')} still open"
    return text
