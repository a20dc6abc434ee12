"""`forklift jobs list|show|retry|cancel|purge`: find jobs, read them, act on them.

Operator commands: they need only the database (--dsn, --schema), not the app.
"""

from __future__ import annotations

import argparse
import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from forklift._bounds import LIST_WINDOW
from forklift._config import positive_int
from forklift._display import line as shown
from forklift.cli import job_actions
from forklift.cli.apps import app_for, job_admin
from forklift.cli.flags import operator_command
from forklift.shown import jobview, output

if TYPE_CHECKING:
    from forklift.admin.rows import Checkpoint

LIMIT = 50
ERROR_CHARS = 60  # of the last error in the list table
CHECKPOINT_CHARS = 120  # of a checkpoint's cursors, step names and state that `show` prints

GROUP_DESCRIPTION = """\
Operator commands on jobs: they need only the database (--dsn, --schema), not the app.
Each has --help with examples and --json for scripts (its shape in its --help).
"""

GROUP_EXAMPLES = """\
examples:
  forklift jobs list --state dead
  forklift jobs show 1042
  forklift jobs retry 1042
  forklift jobs cancel 1043
  forklift jobs purge --state succeeded --older-than 1d
"""

LIST_DESCRIPTION = f"""\
List jobs, newest first (by id), with filters. Each page looks through at most --scan
jobs (of --state when given, through an index; else of all states) for the --queue,
--task and --error matches, so no page ever reads the whole table; when a page comes out
short with more left to look at, stderr says which --before to pass next. The last error
of a job that succeeded or runs again since is an earlier attempt's: it reads
"earlier: ...".

--json prints {{"jobs": [...], "next_before": ID or null}}: next_before is what to pass
as --before for the next page (null: nothing older to look at), and each job has the keys
{jobview.JOB_KEYS}.
"""

LIST_EXAMPLES = """\
examples:
  forklift jobs list --state dead --queue emails
  forklift jobs list --error "timed out" --limit 10
  forklift jobs list --state dead --json | jq '.jobs[].id'
  forklift jobs list --task render --before 1042
"""

SHOW_DESCRIPTION = f"""\
Show one job: its state, attempts and crashes (and snoozes, if it snoozed), timings,
arguments and result (each cut to {jobview.ARGS_CHARS} characters; values of
secret-looking keys and DSN passwords are hidden), the progress it last reported
(done/total, message, how long ago), its batch, and its whole error history: for each
attempt that failed, when, on which worker, the error and its traceback; an operator's
retry or cancel as who did it and when.

--json prints one object with the keys of a `jobs list` job ({jobview.JOB_KEYS}), and
args (the JSON text of the arguments, made safe as above), args_truncated,
idempotency_key, timeout_seconds, lease_until, errors (a list, oldest first, of objects
with the keys attempt, at, worker, error, traceback; null where an entry has none),
result (the handler's return value as a JSON value, whole, secrets hidden as above;
null: none), progress (an object with done, total (null: not known), message, at (ISO
8601 UTC); or null: it reported none), batch_id (or null), workflow_id and step (its
workflow and its name there, or null), waiting_on (upstream jobs a blocked step still
waits for), upstream_failed (the upstream job whose failure cancelled it, or null),
limit_key (its
task limit's key value, or null), worker (the worker that runs it or ran its last
attempt, or null: it never ran), leases_forgiven (attempts added to max_attempts for
leases lost with their worker before the handler ran: not charged, at most 3),
snoozes (runs that snoozed: forklift.Snooze, not counted as attempts) and snoozed_at
(when it last did: ISO 8601 UTC, or null), unique_key and unique_states (a unique job's
key and the states in which it holds it, or null), fair_key, fair_weight and fair_turn
(a fair task's job: its key, its weight, its turn in line while it waits due; or null),
requires (the labels a worker must have to run it, from its task's requires=; or null),
checkpoint (a resumable job's checkpoint, whole, secrets hidden as above: an object with
v, state, cursors, steps, ran; null: none) and checkpoint_at (when it was written: ISO
8601 UTC, or null).

A job with a checkpoint (where its next attempt resumes) ends with it: when it was
written, its cursors, the names of the steps done and the handler's state (cut to
{CHECKPOINT_CHARS} characters each, secrets hidden as above).
"""

SHOW_EXAMPLES = """\
examples:
  forklift jobs show 1042
  forklift jobs show 1042 --json | jq '.errors[-1].traceback'
  forklift jobs show 1042 --json | jq '.result'
  forklift jobs show 1042 --json | jq '.checkpoint.cursors'
"""


def cmd_list(args: argparse.Namespace) -> int:
    from forklift.admin.rows import JobFilter

    app = app_for(args)
    where = JobFilter(args.state, args.queue, args.task, args.error)
    page = job_admin(app).job_list(where, limit=args.limit, before=args.before, window=args.scan)
    if args.json:
        output.print_json(
            {"jobs": [jobview.job_json(j) for j in page.jobs], "next_before": page.next_before}
        )
        return 0
    header = ("id", "state", "queue", "task", "attempts", "crashes", "enqueued", "last error")
    rows = [
        (
            j.id, j.state, j.queue, j.task, f"{j.attempts}/{j.max_attempts}",
            f"{j.crashes}/{j.max_crashes}", f"{output.age(j.age)} ago",
            output.clip(jobview.error_text(j), ERROR_CHARS),
        )
        for j in page.jobs
    ]  # fmt: skip
    output.table(header, rows, empty="no jobs")
    if page.next_before is not None:
        output.hint(f"older jobs: --before {page.next_before}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    app = app_for(args)
    detail = job_admin(app).job_get(args.id)
    if args.json:
        output.print_json({**jobview.detail_json(detail), **checkpoint_json(detail.checkpoint)})
        return 0
    jobview.print_detail(detail)
    if detail.checkpoint is not None:
        print("\n".join(checkpoint_lines(detail.checkpoint, detail.now)))
    return 0


def checkpoint_json(checkpoint: Checkpoint | None) -> dict[str, Any]:
    """`jobs show --json`'s checkpoint keys: the document whole (secrets hidden as in the
    arguments) and when it was written."""
    if checkpoint is None:
        return {"checkpoint": None, "checkpoint_at": None}
    return {
        "checkpoint": jobview.safe_result(json.dumps(checkpoint.document)),
        "checkpoint_at": output.utc(checkpoint.at),
    }


def checkpoint_lines(checkpoint: Checkpoint, now: datetime) -> list[str]:
    """`jobs show`'s checkpoint block: when it was written, then its cursors, the steps
    done and the state, each on one escaped line of at most CHECKPOINT_CHARS."""
    head = f"checkpoint: written {output.when(checkpoint.at, now)}"
    if checkpoint.version is not None:
        head += f", version {checkpoint.version}"
    if checkpoint.ran is not None:
        head += f", {output.age(checkpoint.ran)} of work"
    steps = checkpoint.steps
    return [
        head,
        f"  cursors      {compact(checkpoint.cursors) if checkpoint.cursors else '-'}",
        f"  steps done   {output.clip(', '.join(steps), CHECKPOINT_CHARS) if steps else '-'}",
        f"  state        {compact(checkpoint.state)}",
    ]


def compact(value: Any, width: int = CHECKPOINT_CHARS) -> str:
    """A JSON value on one escaped line of at most `width` characters, secrets hidden
    (`-` for none)."""
    if value is None:
        return "-"
    return shown(jobview.safe_args(json.dumps(value), width)[0])


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    group = sub.add_parser(
        "jobs",
        help="find, read, retry, cancel and purge jobs (operator; needs only the database)",
        description=GROUP_DESCRIPTION,
        epilog=GROUP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = operator_command(
        actions,
        common,
        "list",
        "jobs, newest first, by state, queue, task, error",
        LIST_DESCRIPTION,
        LIST_EXAMPLES,
    )
    p.add_argument(
        "--state",
        choices=jobview.STATES,
        help="only jobs in this state (scheduled: ready and due later; ready: due or not)",
    )
    p.add_argument("--queue", help="only jobs of this queue")
    p.add_argument("--task", help="only jobs of this task")
    p.add_argument(
        "--error", metavar="TEXT", help="only jobs whose last error contains TEXT (any case)"
    )
    p.add_argument(
        "--limit", type=positive_int, default=LIMIT, help=f"jobs per page (default: {LIMIT})"
    )
    p.add_argument(
        "--before", type=int, metavar="ID", help="only jobs older than job ID (the next page)"
    )
    p.add_argument(
        "--scan", type=positive_int, default=LIST_WINDOW, metavar="N",
        help=f"look through at most N jobs for the filters (default: {LIST_WINDOW})",
    )  # fmt: skip
    p.set_defaults(func=cmd_list)

    p = operator_command(
        actions,
        common,
        "show",
        "one job: arguments, timings, its whole error history",
        SHOW_DESCRIPTION,
        SHOW_EXAMPLES,
    )
    p.add_argument("id", type=int, metavar="ID", help="the job's id")
    p.set_defaults(func=cmd_show)

    job_actions.register(actions, common)
