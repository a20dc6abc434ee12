"""How the dashboard's pages read: the wording and safety the CLI shows too
(forklift.shown, forklift._display) turned into what the templates lay out. Every
value a producer, handler or host wrote still passes the templates' escaping."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from forklift.admin.batches import BatchDetail, BatchSummary
from forklift.admin.rows import Checkpoint, JobDetail, JobRow, Progress
from forklift.shown import batchview, jobview, output
from forklift.shown.processes import Listed

ARGS_CHARS = 20_000  # of the arguments' and the result's JSON text a job page shows
ERROR_CHARS = 4_000  # of one error message
TRACEBACK_CHARS = 40_000  # of one traceback
HISTORY_SHOWN = 50  # the latest entries of a job's error history
CELL_CHARS = 120  # of an error in a table
CHECKPOINT_CHARS = 400  # of a checkpoint's cursors, step names and state


def clip(text: str | None, width: int = CELL_CHARS) -> str:
    """`text` on one line, at most `width` characters (`-` for none)."""
    if text is None or not text.strip():
        return "-"
    one = " ".join(text.split())
    return one if len(one) <= width else one[: width - 1] + "…"


def cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class Entry:
    """One entry of a job's error history: an attempt that failed, or an operator's
    retry or cancel (`action`, the CLI's line for it)."""

    attempt: Any
    at: str
    worker: str
    error: str
    traceback: str | None
    action: str | None = None


@dataclass(frozen=True)
class JobView:
    """A job as its page shows it: `forklift jobs show`, field by field."""

    job: JobRow
    detail: JobDetail
    args: str
    args_cut: bool
    result: str | None
    progress: str
    percent: float | None
    history: list[Entry]
    older: int  # history entries not shown (the oldest)

    @property
    def fields(self) -> list[tuple[str, str]]:
        d, j, now = self.detail, self.job, self.detail.now
        return [
            ("state", j.state),
            ("attempts", f"{j.attempts} of {j.max_attempts}"),
            ("crashes", f"{j.crashes} of {j.max_crashes}"),
            *snooze_fields(d),
            ("priority", str(j.priority)),
            ("key", d.idempotency_key or "-"),
            ("progress", self.progress),
            ("limit key", d.limit_key or "-"),
            *([] if (fair := jobview.fair_text(d)) is None else [("fair key", fair)]),
            *([] if (labels := jobview.requires_text(d)) is None else [("requires", labels)]),
            ("timeout", "-" if d.timeout is None else f"{d.timeout:g} s"),
            ("enqueued", output.when(j.created_at, now)),
            ("available", output.when(j.available_at, now)),
            ("started", output.when(j.started_at, now)),
            ("completed", output.when(j.completed_at, now)),
            ("worker", jobview.worker(d) or "-"),
            ("lease until", output.when(d.lease_until, now)),
            ("last error", cut(jobview.error_text(j), ERROR_CHARS)),
            *checkpoint_fields(d.checkpoint, now),
        ]

    @property
    def retryable(self) -> bool:
        return self.job.state in ("dead", "cancelled")

    @property
    def resumable(self) -> bool:
        """It has a checkpoint: a retry resumes from it (or, from scratch, clears it)."""
        return self.detail.checkpoint is not None

    @property
    def cancellable(self) -> bool:
        return self.job.state in ("ready", "running")


def snooze_fields(detail: JobDetail) -> list[tuple[str, str]]:
    """How often the job snoozed, and when last, as `jobs show` tells it (none: never)."""
    text = jobview.snooze_text(detail)
    return [] if text is None else [("snoozes", text)]


def checkpoint_fields(checkpoint: Checkpoint | None, now: datetime) -> list[tuple[str, str]]:
    """A job's checkpoint as `jobs show` tells it: when it was written, its cursors, the
    steps done and the state (compact JSON, secrets hidden, cut); none: no fields."""
    if checkpoint is None:
        return []
    written = output.when(checkpoint.at, now)
    if checkpoint.version is not None:
        written += f", version {checkpoint.version}"
    if checkpoint.ran is not None:
        written += f", {output.age(checkpoint.ran)} of work"
    steps = ", ".join(checkpoint.steps)
    return [
        ("checkpoint", written),
        ("cursors", _compact(checkpoint.cursors or None)),
        ("steps done", clip(steps, CHECKPOINT_CHARS)),
        ("checkpoint state", _compact(checkpoint.state)),  # the job's own is "state"
    ]


def _compact(value: Any) -> str:
    """A JSON value as one line of at most CHECKPOINT_CHARS, secrets hidden (`-`: none)."""
    if value is None:
        return "-"
    return jobview.safe_args(json.dumps(value), CHECKPOINT_CHARS)[0]


def _pretty(text: str) -> str:
    """JSON text indented for reading (as it is, when it does not parse)."""
    try:
        return json.dumps(json.loads(text), indent=2, ensure_ascii=False)
    except ValueError:
        return text


def job_view(detail: JobDetail) -> JobView:
    args, args_cut = jobview.safe_args(detail.args, ARGS_CHARS)
    result = None
    if detail.result is not None:
        result = cut(json.dumps(jobview.safe_result(detail.result), indent=2), ARGS_CHARS)
    history = [_entry(e, detail.now) for e in detail.errors[-HISTORY_SHOWN:]]
    return JobView(
        detail.job,
        detail,
        args if args_cut else _pretty(args),
        args_cut,
        result,
        jobview.progress_text(detail.progress, detail.now),
        _percent(detail.progress),
        history,
        max(0, len(detail.errors) - HISTORY_SHOWN),
    )


def _percent(progress: Progress | None) -> float | None:
    return None if progress is None else progress.percent


def _entry(raw: dict[str, Any], now: datetime) -> Entry:
    entry = jobview.history_entry(raw)
    action = jobview.operator_action(entry, now)
    traceback = entry.get("traceback")
    return Entry(
        entry.get("attempt"),
        jobview.history_time(entry.get("at"), now),
        str(entry.get("worker") or "-"),
        cut(str(entry.get("error") or "-"), ERROR_CHARS),
        cut(str(traceback).rstrip(), TRACEBACK_CHARS) if traceback else None,
        action.strip() if action else None,
    )


def percent(value: float | None) -> str:
    return output.percent(value)


@dataclass(frozen=True)
class Segment:
    """A part of a batch's progress bar: its jobs in one state."""

    state: str
    count: int
    x: float  # percent of the bar from the left
    width: float  # percent of the bar


BAR_STATES = ("succeeded", "dead", "cancelled", "running", "ready")


def segments(s: BatchSummary) -> list[Segment]:
    """A batch's jobs by state along its bar, ended first (counts of the total)."""
    total = max(s.row.total, 1)
    found, x = [], 0.0
    for state in BAR_STATES:
        n = s.count(state)
        if n:
            width = 100.0 * n / total
            found.append(Segment(state, n, round(x, 3), round(width, 3)))
            x += width
    return found


def batch_rate(s: BatchSummary) -> str:
    return batchview.rate(s)


def batch_eta(s: BatchSummary) -> str:
    return batchview.eta(s)


def callback_cell(s: BatchSummary) -> str:
    return batchview.callback_cell(s)


def callback_spec(d: BatchDetail) -> dict[str, Any] | None:
    """The batch's callback as `batches show` tells it: task, queue, args made safe."""
    return batchview.callback_json(d.callback)


def by_host(lines: list[Listed]) -> dict[str, list[Listed]]:
    """Processes by host, in the registry's order (each supervisor before its workers)."""
    found: dict[str, list[Listed]] = {}
    for line in lines:
        found.setdefault(line.host, []).append(line)
    return found
