"""How a frame of `forklift top` is laid out: fixed-width lines that fit an 80x24 terminal
(wider and taller ones show more), styled with rich, never wrapped. Every name, host and
error is escaped (forklift._display) before it is measured and cut, so what the database
holds cannot move the cursor or the columns."""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group
from rich.text import Text

from forklift._display import line as shown
from forklift.admin.rows import Progress
from forklift.cli import limits
from forklift.cli.top.frame import Frame, Trends, Worker
from forklift.shown import output

SPARKS = "▁▂▃▄▅▆▇█"
CHECKPOINT = "↻"  # before the age of a running job's checkpoint, in its PROGRESS
QUEUE_HEAD = (
    f"{'QUEUE':<16} {'READY':>6} {'SCHED':>5} {'RUN':>4} {'DEAD':>5} {'OLDEST':>6} "
    f"{'DONE/M':>6} {'DEPTH':<11} {'DONE/M':<11}"
)
LIMITS_FROM = len(QUEUE_HEAD) + 12  # a terminal this wide shows each queue's limits too
RUNNING = 28  # characters of the RUNNING column: task#id (+ more jobs)
WORKER_HEAD = f"{'HOST':<16} {'PID':>7}  {'RUNNING':<{RUNNING}} {'FOR':>6} {'RSS':>7}  PROGRESS"
FIXED_LINES = 8  # header, 3 titles, 2 column heads, 2 blank lines


def spark(values: Sequence[int], width: int) -> str:
    """A sparkline of the last `width` values, scaled to their largest."""
    shown = list(values)[-width:]
    top = max(shown, default=0)
    if top <= 0:
        return SPARKS[0] * len(shown)
    return "".join(SPARKS[round(max(0, v) / top * (len(SPARKS) - 1))] for v in shown)


def _line(text: str, width: int, style: str = "") -> Text:
    return Text(shown(text)[:width], style=style, no_wrap=True, overflow="crop")


def _queue_head(width: int) -> str:
    return f"{QUEUE_HEAD} LIMITS" if width >= LIMITS_FROM else QUEUE_HEAD


def _queue_lines(frame: Frame, trends: Trends, width: int, rows: int) -> list[Text]:
    lines = []
    for q in frame.queues[:rows]:
        queue = shown(q.queue)
        name = f"{queue[:9]} paused" if q.paused else queue[:16]
        oldest = "-" if q.oldest_ready_age is None else output.age(q.oldest_ready_age)
        text = (
            f"{name:<16} {q.ready:>6} {q.scheduled:>5} {q.running:>4} {q.dead:>5} {oldest:>6} "
            f"{q.succeeded_last_minute:>6} {spark(trends.depth.get(q.queue, ()), 11):<11} "
            f"{spark(trends.rate.get(q.queue, ()), 11):<11}"
        )
        if width >= LIMITS_FROM:
            text += f" {limits.cell(q)}"
        lines.append(_line(text, width, "yellow" if q.paused else "red" if q.dead else ""))
    return lines


def _running(worker: Worker) -> tuple[str, str, str]:
    """What a worker runs (its first job, and how many more), for how long, how far."""
    if not worker.jobs:
        return "idle", "", ""
    first = worker.jobs[0]
    tail = f"#{first.id}" + (f" +{len(worker.jobs) - 1}" if len(worker.jobs) > 1 else "")
    job = f"{shown(first.task)[: max(1, RUNNING - len(tail))]}{tail}"
    return job, output.age(first.running_for), progress(first.progress, first.checkpoint_age)


def progress(p: Progress | None, checkpoint_age: float | None = None) -> str:
    """A running job's progress in a few characters: `37%` (or `12` when its total is
    not known), then `↻12s` when it has a checkpoint (written 12 s ago), then its
    message, escaped: what is shortest first, so that a narrow terminal keeps it."""
    parts = []
    if p is not None:
        parts.append(output.number(p.done) if p.percent is None else output.percent(p.percent))
    if checkpoint_age is not None:
        parts.append(f"{CHECKPOINT}{output.age(checkpoint_age)}")
    if p is not None and p.message:
        parts.append(shown(p.message))
    return " ".join(parts)


def _worker_lines(frame: Frame, width: int, rows: int) -> list[Text]:
    lines = []
    for w in frame.workers[:rows]:
        job, took, far = _running(w)
        rss = f"{w.rss_bytes / 2**20:.0f} MiB" if w.rss_bytes else "-"
        text = f"{shown(w.host)[:16]:<16} {w.pid:>7}  {job:<{RUNNING}} {took:>6} {rss:>7}  {far}"
        lines.append(_line(text.rstrip(), width, "" if w.jobs else "dim"))
    return lines


def _failure_lines(frame: Frame, width: int, rows: int) -> list[Text]:
    lines = []
    for d in frame.failures[:rows]:
        head = f"#{d.id:<8} {shown(d.task)[:16]:<16} {output.age(d.ago) + ' ago':>9}  "
        lines.append(_line(head + output.clip(d.error, max(1, width - len(head))), width, "red"))
    return lines


def _title(text: str, shown: int, total: int, width: int) -> Text:
    more = f"  ({total - shown} more not shown)" if total > shown else ""
    return _line(text + more, width, "bold")


def _rows(frame: Frame, height: int) -> tuple[int, int, int]:
    """How many queue, worker and failure lines fit: failures get up to 3, queues up to
    half of what is left, workers the rest (each at least one when it has any); room
    that one section leaves goes to queues, then failures."""
    room = max(3, height - FIXED_LINES)
    failures = min(len(frame.failures), 3, max(1, room // 5))
    queues = min(len(frame.queues), max(1, (room - failures) // 2))
    workers = min(len(frame.workers), max(1, room - failures - queues))
    spare = max(0, room - failures - queues - workers)
    more_queues = min(spare, len(frame.queues) - queues)
    spare -= more_queues
    return queues + more_queues, workers, failures + min(spare, len(frame.failures) - failures)


def render(frame: Frame, trends: Trends, width: int, height: int) -> Group:
    """The whole screen for one frame."""
    queues, workers, failures = _rows(frame, height)
    clock = f"{frame.at.astimezone():%H:%M:%S}"
    head = f"forklift top  {clock}  {shown(frame.where)}"
    quit_hint = "  q quits"
    room = max(0, width - len(quit_hint))
    header = _line(f"{head[:room]:<{room}}{quit_hint}", width, "bold reverse")
    busy = sum(1 for w in frame.workers if w.jobs)
    lines = [header]
    if frame.error is not None:
        lines[0] = _line(f"{head}  {frame.error}", width, "bold white on red")
    lines += [
        _title(f"Queues ({len(frame.queues)})", queues, len(frame.queues), width),
        _line(_queue_head(width), width, "dim"),
        *_queue_lines(frame, trends, width, queues),
        _line("", width),
        _title(
            f"Workers: {len(frame.workers)} ({busy} busy) of "
            f"{output.plural(frame.supervisors, 'supervisor')}",
            workers, len(frame.workers), width,
        ),
        _line(WORKER_HEAD, width, "dim"),
        *_worker_lines(frame, width, workers),
        _line("", width),
        _title("Recent failures (dead)", failures, len(frame.failures), width),
        *_failure_lines(frame, width, failures),
    ]  # fmt: skip
    return Group(*lines[:height])
