"""`forklift batches list|show|cancel`: where batches stand, and cancelling one.

Operator commands: they need only the database (--dsn, --schema), not the app.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from forklift import _display
from forklift._bounds import DEAD_SHOWN
from forklift._config import positive_int
from forklift.cli.apps import app_for, batch_admin
from forklift.cli.errors import Exit
from forklift.cli.flags import operator_command
from forklift.shown import output
from forklift.shown.batchview import (
    batch_json,
    callback_cell,
    callback_json,
    cancel_json,
    cancel_text,
    detail_json,
    eta,
    rate,
)

if TYPE_CHECKING:
    from forklift.admin.batches import BatchDetail, BatchSummary

LIMIT = 20

GROUP_DESCRIPTION = """\
Operator commands on batches (app.enqueue_batch, app.batch): they need only the
database (--dsn, --schema), not the app. Each has --help with examples and --json for
scripts (its shape in its --help).
"""

GROUP_EXAMPLES = """\
examples:
  forklift batches list
  forklift batches show 17
  forklift batches cancel 17
"""

BATCH_KEYS = """\
id, state (filling: its producer still adds jobs; open: sealed, jobs left; finished),
outcome (succeeded, failed: some went dead, cancelled, abandoned: its producer left it
filling for --batch-abandon-after; null until finished), total,
ready, running, succeeded, dead, cancelled, pending (ready + running), done (total -
pending), percent (done of total, or null for a batch of none), rate_per_second (jobs
ended per second since it was created, or null before any ended), eta_seconds (pending
jobs at that rate, or null), age_seconds, created_at, sealed_at, cancelled_at,
finished_at, abandoned_at (ISO 8601 UTC, or null), cancelled_by (user@host, or null),
callback_task,
callback_job_id, callback_state (its callback's task, once enqueued its job id and state;
null when none)"""

LIST_DESCRIPTION = f"""\
List batches: those not finished (newest first), then those finished most recently
(the latest first), up to --limit of each, with their jobs counted by state, how far
each is (jobs ended of its total), its rate (jobs ended per second since it was made),
its ETA (its pending jobs at that rate), its callback (task, job id and state) and its
age. Reads the batches' own index and each batch's jobs through the batch indexes: never
the whole jobs table.

--json prints {{"open": [...], "finished": [...]}}, each batch an object with the keys
{BATCH_KEYS}.
"""

LIST_EXAMPLES = """\
examples:
  forklift batches list
  forklift batches list --limit 5
  forklift batches list --json | jq '.open[] | select(.dead > 0) | .id'
"""

SHOW_DESCRIPTION = f"""\
Show one batch: its state and outcome, its jobs by state, how far it is, its rate and
ETA, the progress its running jobs report (ctx.progress, summed over them), when it was
made, sealed, cancelled (by whom) and finished, its callback (task, arguments with the
values of secret-looking keys hidden, and once enqueued its job: state, attempts, last
error) and its first dead jobs with their errors.

--json prints one object with the keys of a `batches list` batch ({BATCH_KEYS}), and
running_progress_done, running_progress_total (the progress its running jobs report,
summed), last_ended_at (its latest job's end, or null), callback (the callback as the
batch keeps it, the columns of its job: queue, task, args (JSON text, made safe as
above), priority, max_attempts, max_crashes, timeout, batch_id, limit_key, trace_context;
or null: none), callback_job (the callback's job with
the keys of a `jobs list` job, or null: not enqueued yet, none, or pruned), dead_jobs
(its first {DEAD_SHOWN} dead jobs: objects with id, last_error).
"""

SHOW_EXAMPLES = """\
examples:
  forklift batches show 17
  forklift batches show 17 --json | jq '.callback_job.state'
"""

CANCEL_DESCRIPTION = """\
Cancel a batch: mark it cancelled (by you, user@host) and cancel its ready and running
jobs, as `forklift jobs cancel` does (a running job's worker is told to stop and, if its
handler does not return within `forklift run`'s --cancel-grace, killed). Its jobs that
ended are kept as they are. Once none of its jobs is open the batch finishes with the
outcome cancelled, and its callback runs once (it sees the outcome in ctx.batch). A
batch still filling (its producer's `with app.batch()` block may add jobs, or its
producer died in it) is sealed too: its producer's next add is refused, and it finishes
now. Exit 1 if the batch had finished already (nothing is cancelled) or there is no such
batch.

--json prints one object: id, result (cancelled, already_cancelled: marked before, its
open jobs cancelled now; finished: it had finished, nothing done), cancelled_ready,
cancelled_running (jobs cancelled), not_cancelled (jobs that ended before they could be),
state, outcome, cancelled_by, callback_job_id (the batch after it).
"""

CANCEL_EXAMPLES = """\
examples:
  forklift batches cancel 17
  forklift batches cancel 17 --json | jq '.cancelled_ready + .cancelled_running'
"""


def _row(s: BatchSummary) -> tuple[object, ...]:
    return (
        s.row.id, s.state, s.row.total, s.count("ready"), s.count("running"),
        s.count("succeeded"), s.count("dead"), s.count("cancelled"), output.percent(s.percent),
        rate(s), eta(s), callback_cell(s), output.age(s.age), s.row.outcome or "-",
    )  # fmt: skip


HEADER = (
    "id", "state", "total", "ready", "running", "ok", "dead", "cancelled", "done", "rate",
    "eta", "callback", "age", "outcome",
)  # fmt: skip


def cmd_list(args: argparse.Namespace) -> int:
    app = app_for(args)
    open_, finished = batch_admin(app).batch_list(args.limit)
    if args.json:
        output.print_json(
            {"open": [batch_json(s) for s in open_], "finished": [batch_json(s) for s in finished]}
        )
        return 0
    output.table(HEADER, [_row(s) for s in open_ + finished], empty="no batches")
    if len(open_) == args.limit or len(finished) == args.limit:
        output.hint(f"more batches than shown: --limit {args.limit * 2}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    app = app_for(args)
    detail = batch_admin(app).batch_get(args.id)
    if args.json:
        output.print_json(detail_json(detail))
    else:
        print("\n".join(detail_lines(detail)))
    return 0


def detail_lines(d: BatchDetail) -> list[str]:
    """`forklift batches show` for people; every value escaped, one field a line."""
    s, row, now = d.summary, d.summary.row, d.summary.row.now
    shown = _display.line
    counts = ", ".join(
        f"{s.count(state)} {state}"
        for state in ("ready", "running", "succeeded", "dead", "cancelled")
    )
    running = "none"
    if s.count("running"):
        summed = output.fraction(s.counts.progress_done, s.counts.progress_total)
        running = (
            f"{summed}: the progress its running job reports"
            if s.count("running") == 1
            else f"{summed}: the progress its {s.count('running')} running jobs report, summed"
        )
    cancelled = output.when(row.cancelled_at, now)
    if row.cancelled_by:
        cancelled += f" by {shown(row.cancelled_by)}"
    lines = [
        f"batch {row.id}: {s.state}" + (f", {row.outcome}" if row.outcome else ""),
        f"  jobs         {row.total}: {counts}",
        f"  done         {output.fraction(s.done, row.total)}",
        f"  rate         {rate(s)} (since it was created)",
        f"  eta          {eta(s)}",
        f"  running      {running}",
        f"  created      {output.when(row.created_at, now)}",
        f"  sealed       {output.when(row.sealed_at, now)}",
        f"  cancelled    {cancelled}",
        f"  finished     {output.when(row.finished_at, now)}",
        *([f"  abandoned    {output.when(row.abandoned_at, now)}"] if row.abandoned_at else []),
        f"  last ended   {output.when(s.counts.last_ended, now)}",
        *_callback_lines(d),
    ]
    if d.dead:
        lines.append(f"dead jobs (the first {len(d.dead)}):")
        lines += [f"  job {i}: {shown(error or '-')}" for i, error in d.dead]
    return lines


def _callback_lines(d: BatchDetail) -> list[str]:
    spec = callback_json(d.callback)
    if spec is None:
        return ["  callback     none"]
    shown = _display.line
    lines = [
        f"  callback     {shown(spec.get('task'))} in queue {shown(spec.get('queue'))}",
        f"    args       {shown(spec.get('args'))}",
    ]
    job = d.callback_job
    if job is not None:
        j = job.job
        lines.append(
            f"    job        {j.id}: {j.state}, attempts {j.attempts} of {j.max_attempts}, "
            f"last error {output.clip(j.last_error, 200)}"
        )
    elif d.summary.row.callback_job_id is not None:
        lines.append(f"    job        {d.summary.row.callback_job_id}: pruned")
    else:
        lines.append("    job        not yet: it is enqueued when the batch finishes")
    return lines


def cmd_cancel(args: argparse.Namespace) -> int:
    app = app_for(args)
    done = batch_admin(app).batch_cancel(args.id)
    if args.json:
        output.print_json(cancel_json(args.id, done))
    else:
        output.say(cancel_text(args.id, done))
    return Exit.ERROR if done.refused else Exit.OK


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    group = sub.add_parser(
        "batches",
        help="batches: their jobs by state, progress, rate, ETA, callback; cancel one "
        "(operator; needs only the database)",
        description=GROUP_DESCRIPTION,
        epilog=GROUP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = operator_command(
        actions, common, "list", "open batches, then the latest finished, with counts and ETA",
        LIST_DESCRIPTION, LIST_EXAMPLES,
    )  # fmt: skip
    p.add_argument(
        "--limit", type=positive_int, default=LIMIT,
        help=f"at most this many open and this many finished batches (default: {LIMIT})",
    )  # fmt: skip
    p.set_defaults(func=cmd_list)

    p = operator_command(
        actions, common, "show", "one batch: counts, progress, ETA, callback, dead jobs",
        SHOW_DESCRIPTION, SHOW_EXAMPLES,
    )  # fmt: skip
    p.add_argument("id", type=int, metavar="ID", help="the batch's id")
    p.set_defaults(func=cmd_show)

    p = operator_command(
        actions, common, "cancel", "cancel a batch: its ready and running jobs too",
        CANCEL_DESCRIPTION, CANCEL_EXAMPLES,
    )  # fmt: skip
    p.add_argument("id", type=int, metavar="ID", help="the batch's id")
    p.set_defaults(func=cmd_cancel)
