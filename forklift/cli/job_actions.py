"""`forklift jobs retry|cancel|purge`: the operator's actions on jobs, one line per job."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from forklift._bounds import BATCH
from forklift._config import duration
from forklift.cli.apps import app_for, job_admin
from forklift.cli.errors import Exit, UsageError
from forklift.cli.flags import operator_command
from forklift.shown import output
from forklift.shown.jobview import cancel_line, retry_line

if TYPE_CHECKING:
    from forklift.admin.rows import Acted

RETRY_DESCRIPTION = """\
Put dead or cancelled jobs back to ready, due now. Their attempts and crashes are RESET
to 0: a retried job gets its whole max_attempts and max_crashes budget again (its error
history keeps every earlier attempt, and notes the retry). One line per job; exit 1 if
any job named was not retried (not found, or not dead or cancelled, or a unique job whose
key another live job holds now: a retry would make a second live job of its key).

A resumable job that died keeps its checkpoint: retried, it resumes where its last
attempt left off (its cursors, the steps it did, its state). --from-scratch clears the
checkpoint too, and the job starts over from the beginning, as when it was enqueued. (A
cancelled job has none left to resume: cancelling clears it.)

--json prints a list with one object per job: id, result (retried, not_found,
not_retryable), was (its state before, or null), attempts_before, crashes_before,
checkpoint (kept: it resumes; cleared: by --from-scratch; null: it had none),
unique_key_held_by (the live job holding a unique job's key, which kept it from being
retried; null: none).
"""

RETRY_EXAMPLES = """\
examples:
  forklift jobs retry 1042 1043
  forklift jobs retry 1042 --from-scratch
  forklift jobs retry --all-dead --queue emails --task send_receipt
  forklift jobs retry --all-dead --json | jq '[.[] | select(.result == "retried")] | length'
"""

CANCEL_DESCRIPTION = """\
Cancel jobs. A ready job is cancelled at once and never runs, and so is a blocked
workflow step (with the steps that need it). A running job is
cancelled at once too, wherever it runs: its lease is taken from its worker, so nothing
that worker records for it commits (its effect transaction rolls back); the worker hears
it (NOTIFY, or its next lease renewal) and sets ctx.cancelled; a handler that has not
returned within `forklift run`'s --cancel-grace has its worker process killed and
replaced. A cancelled job is never retried unless you `jobs retry` it, and its checkpoint
is cleared: retried, it starts from the beginning. One line per job; exit 1 if any job
named was not cancelled (not found, or finished already).

--json prints a list with one object per job: id, result (cancelled, not_found,
not_cancellable), was (its state before, or null), worker (who was running it, or null).
"""

CANCEL_EXAMPLES = """\
examples:
  forklift jobs cancel 1042
  forklift jobs cancel $(forklift jobs list --state ready --task resize --json | jq '.jobs[].id')
"""

PURGE_DESCRIPTION = f"""\
Delete finished jobs (succeeded, dead or cancelled) that completed more than
--older-than ago, in batches of {BATCH}, each its own short transaction that skips rows
another one holds: workers claiming jobs are never blocked. Retention pruning (`run
--retain-finished`, `--retain-dead`) does the same on its own; this is for doing it now.
Like retention, it keeps the jobs of a batch until the batch and its callback have
finished (the callback reads them; the batch's outcome counts them).

--json prints one object: state, older_than_seconds, cutoff (ISO 8601 UTC), dry_run,
jobs (deleted, or in a dry run found), batches, at_least (a dry run stopped counting).
"""

PURGE_EXAMPLES = """\
examples:
  forklift jobs purge --state dead --older-than 7d --dry-run
  forklift jobs purge --state succeeded --older-than 1h
"""


def cmd_retry(args: argparse.Namespace) -> int:
    if bool(args.ids) == args.all_dead:
        raise UsageError("name job ids, or --all-dead (not both)")
    if (args.queue or args.task) and not args.all_dead:
        raise UsageError("--queue and --task select jobs for --all-dead only")
    app = app_for(args)
    admin = job_admin(app)
    scratch = args.from_scratch
    if args.all_dead:
        acted = [
            a
            for ids in admin.job_dead_ids(args.queue, args.task)
            for a in admin.job_retry_many(ids, from_scratch=scratch)
        ]
    else:
        acted = admin.job_retry_many(args.ids, from_scratch=scratch)
    if args.json:
        output.print_json([_retried(a) for a in acted])
    elif args.all_dead and not acted:
        print("no dead jobs")
    else:
        for a in acted:
            output.say(retry_line(a) + a.checkpoint_note)
    return Exit.OK if all(a.done for a in acted) else Exit.ERROR


def _retried(a: Acted) -> dict[str, Any]:
    result = "retried" if a.done else "not_found" if a.was is None else "not_retryable"
    return {
        "id": a.id, "result": result, "was": a.was,
        "attempts_before": a.attempts, "crashes_before": a.crashes, "checkpoint": a.checkpoint,
        "unique_key_held_by": a.held_by,
    }  # fmt: skip


def cmd_cancel(args: argparse.Namespace) -> int:
    app = app_for(args)
    acted = job_admin(app).job_cancel_many(args.ids)
    if args.json:
        output.print_json([_cancelled(a) for a in acted])
    else:
        for a in acted:
            output.say(cancel_line(a))
    return Exit.OK if all(a.done for a in acted) else Exit.ERROR


def _cancelled(a: Acted) -> dict[str, Any]:
    result = "cancelled" if a.done else "not_found" if a.was is None else "not_cancellable"
    return {"id": a.id, "result": result, "was": a.was, "worker": a.owner}


def cmd_purge(args: argparse.Namespace) -> int:
    app = app_for(args)
    done = job_admin(app).job_purge(args.state, args.older_than, dry_run=args.dry_run)
    if args.json:
        output.print_json(
            {
                "state": done.state, "older_than_seconds": args.older_than,
                "cutoff": output.utc(done.cutoff), "dry_run": args.dry_run, "jobs": done.jobs,
                "batches": done.batches, "at_least": done.capped,
            }
        )  # fmt: skip
        return 0
    verb = "would purge" if args.dry_run else "purged"
    count = ("at least " if done.capped else "") + output.plural(done.jobs, f"{done.state} job")
    batches = output.plural(done.batches, "batch", "batches")
    tail = "" if args.dry_run else f", in {batches} of at most {BATCH}"
    print(
        f"{verb} {count} completed before {output.utc(done.cutoff)} "
        f"(older than {output.age(args.older_than)}){tail}"
    )
    return 0


def register(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = operator_command(
        actions,
        common,
        "retry",
        "dead or cancelled jobs back to ready",
        RETRY_DESCRIPTION,
        RETRY_EXAMPLES,
    )
    p.add_argument("ids", type=int, nargs="*", metavar="ID", help="the jobs to retry")
    p.add_argument("--all-dead", action="store_true", help="every dead job (of --queue, --task)")
    p.add_argument("--queue", help="with --all-dead: only dead jobs of this queue")
    p.add_argument("--task", help="with --all-dead: only dead jobs of this task")
    p.add_argument(
        "--from-scratch", action="store_true",
        help="clear each job's checkpoint too: it starts over instead of resuming",
    )  # fmt: skip
    p.set_defaults(func=cmd_retry)

    p = operator_command(
        actions,
        common,
        "cancel",
        "cancel ready or running jobs, wherever they run",
        CANCEL_DESCRIPTION,
        CANCEL_EXAMPLES,
    )
    p.add_argument("ids", type=int, nargs="+", metavar="ID", help="the jobs to cancel")
    p.set_defaults(func=cmd_cancel)

    p = operator_command(
        actions,
        common,
        "purge",
        "delete old finished jobs, in small batches",
        PURGE_DESCRIPTION,
        PURGE_EXAMPLES,
    )
    p.add_argument(
        "--state",
        required=True,
        choices=("succeeded", "dead", "cancelled"),
        help="the jobs to purge",
    )
    p.add_argument(
        "--older-than",
        required=True,
        type=duration,
        metavar="AGE",
        help="completed longer ago than this (e.g. 7d, 12h)",
    )
    p.add_argument("--dry-run", action="store_true", help="count what would go; delete nothing")
    p.set_defaults(func=cmd_purge)
