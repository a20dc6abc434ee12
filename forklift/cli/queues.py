"""`forklift queues [pause|resume|limit Q]`: every queue's counts and limits, pausing
claims everywhere, and setting a queue's limits."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from forklift.cli import limits
from forklift.cli.apps import admin_store, app_for
from forklift.cli.errors import Refused, UsageError
from forklift.cli.flags import operator_command
from forklift.shown import output

if TYPE_CHECKING:
    from forklift.admin import AdminStore, LimitChange, PausedQueue, QueueStats

DESCRIPTION = """\
Without an action: per queue, whether it is paused, its ready (due now), scheduled (due
later), running and dead jobs, how long the oldest ready job has waited, and the jobs
done and gone dead in the last minute.

pause Q: no worker of any replica claims from Q any more, from its next claim on (jobs
already running finish). Persisted in the database: it holds across restarts until
`resume Q`, which wakes the workers that serve Q at once. A queue may be paused before
it has any jobs. Pausing or resuming twice is not an error.

limit Q: limits of Q held across every replica, from the workers' next look at them
(each second): --concurrency N jobs of Q running at once; --rate N/s (or N/Ns, N/m, N/h:
100/60s, 500/h) jobs of Q started in any such window; --max-depth N jobs Q may hold
waiting (ready or scheduled), past which an enqueue fails with QueueFull. A flag not
given keeps its value; the value `none` removes that one limit (0 is refused: to stop
claims from Q, pause it); --clear removes every limit of Q. A queue left without any has
its row removed, as --clear does. Prints what is now in force. The limits show in
`queues`, `status`, `top` and /metrics; the tasks' limits (declared in code) are listed
below the table.

A queue nobody uses (no jobs ready, running or dead, none among the newest finished, no
registered process serving it, no limits) is refused for pause and limit, with the close
names that are in use: it is most likely a typo, and pausing or limiting it would leave
the real queue as it was. --force does it anyway: ahead of a deploy that brings its
workers.

--json prints, without an action, a list with one object per queue: queue, paused,
paused_at (ISO 8601 UTC, or null), paused_by (user@host, or null), ready, scheduled,
running, dead, oldest_ready_age_seconds (or null), succeeded_last_minute,
dead_last_minute, succeeded_last_hour, dead_last_hour, concurrency, rate, per (seconds),
max_depth (each null: no such limit), rejected (enqueues max_depth refused); with pause
or resume, one object: queue, action, changed (false: it was paused, or not paused,
already); with limit, one object: queue, action, and what is now in force: concurrency,
rate, per, max_depth, rejected.
"""

EXAMPLES = """\
examples:
  forklift queues
  forklift queues pause emails
  forklift queues pause reports --force
  forklift queues resume emails
  forklift queues limit emails --concurrency 4 --rate 10/s --max-depth 10000
  forklift queues limit emails --rate none
  forklift queues limit emails --clear
"""


def as_json(s: QueueStats, paused: PausedQueue | None) -> dict[str, Any]:
    return {
        "queue": s.queue,
        "paused": s.paused,
        "paused_at": output.utc(paused.paused_at) if paused else None,
        "paused_by": paused.paused_by if paused else None,
        "ready": s.ready,
        "scheduled": s.scheduled,
        "running": s.running,
        "dead": s.dead,
        "oldest_ready_age_seconds": s.oldest_ready_age,
        "succeeded_last_minute": s.succeeded_last_minute,
        "dead_last_minute": s.dead_last_minute,
        "succeeded_last_hour": s.succeeded_last_hour,
        "dead_last_hour": s.dead_last_hour,
        **limits.stats_json(s),
    }


def cmd_queues(args: argparse.Namespace) -> int:
    flagged = limits.given(args)
    if flagged and args.action != "limit":
        raise UsageError(f"{', '.join(flagged)}: for queues limit QUEUE only")
    change = None
    if args.action == "limit":  # the command line checked before the database is asked
        _named(args)
        change = limits.change_of(args)
    app = app_for(args)
    admin = admin_store(app)
    if args.action == "limit":
        return _limit(admin, args, change)
    if args.action is not None:
        return _act(admin, args)
    if args.queue is not None:
        raise UsageError(f"{args.queue!r}: name an action first: queues pause|resume|limit QUEUE")
    return _show(admin, args)


def _show(admin: AdminStore, args: argparse.Namespace) -> int:
    """Every queue's counts and limits; the tasks' limits below them."""
    with admin.connector.session("forklift queues: reading failed"):
        stats = admin.queue_stats()
        paused = {p.queue: p for p in admin.queue_paused_list()}
        tasks = limits.task_lines(admin.limit_list())
    if args.json:
        output.print_json([as_json(s, paused.get(s.queue)) for s in stats])
        return 0
    header = (
        "queue", "paused", "ready", "scheduled", "running", "dead", "oldest ready",
        "done 1m", "dead 1m", "limits",
    )  # fmt: skip
    rows = [
        (
            s.queue, _paused(paused.get(s.queue)), s.ready, s.scheduled, s.running, s.dead,
            "-" if s.oldest_ready_age is None else output.age(s.oldest_ready_age),
            s.succeeded_last_minute, s.dead_last_minute, limits.cell(s),
        )
        for s in stats
    ]  # fmt: skip
    output.table(header, rows, empty="no queues: no jobs, none paused or limited")
    limits.print_task_lines(tasks)
    return 0


def _paused(p: PausedQueue | None) -> str:
    return "-" if p is None else f"{output.age(p.paused_for)} ago by {p.paused_by}"


def _act(admin: AdminStore, args: argparse.Namespace) -> int:
    queue = _named(args)
    if args.action == "pause":
        if not args.force:
            _check_in_use(admin, queue, "pause")
        changed = admin.queue_pause(queue)
        text = (
            f"queue {queue} paused: no worker claims from it until `forklift queues resume "
            f"{queue}`; jobs running now finish"
            if changed
            else f"queue {queue} was paused already"
        )
    else:
        changed = admin.queue_resume(queue)
        text = f"queue {queue} resumed" if changed else f"queue {queue} was not paused"
        if not changed:
            text += _did_you_mean(queue, (p.queue for p in admin.queue_paused_list()))
    if args.json:
        output.print_json({"queue": queue, "action": args.action, "changed": changed})
    else:
        output.say(text)
    return 0


def _limit(admin: AdminStore, args: argparse.Namespace, change: LimitChange | None) -> int:
    """Set (or, `change` None, clear) the limits of the queue; print what is in force."""
    queue = _named(args)
    if change is None:
        had = admin.queue_limit_clear(queue)
        text = limits.in_force(queue, None)
        if had is None:
            limited = (s.name for s in admin.limit_list() if s.scope == "queue")
            text += f", it had none{_did_you_mean(queue, limited)}"
        else:
            text += f" (removed: {had.describe()})"
        now = None
    else:
        if not args.force:
            _check_in_use(admin, queue, "limit")
        now = admin.queue_limit_set(queue, change)
        text = limits.in_force(queue, now)
    if args.json:
        output.print_json(limits.limit_json(queue, now))
    else:
        output.say(text)
    return 0


def _named(args: argparse.Namespace) -> str:
    if args.queue is None:
        raise UsageError(
            f"queues {args.action} needs the queue's name, e.g. queues {args.action} emails"
        )
    return str(args.queue)


def _check_in_use(admin: AdminStore, queue: str, verb: str) -> None:
    """Refuse to `verb` a queue nobody uses (a typo, most likely), naming the close ones."""
    from forklift.admin import checked_queue

    checked_queue(queue)  # a malformed name is refused for what is wrong with it
    known = admin.queue_known_list()
    if queue in known:
        return
    raise Refused(
        f"queue {queue!r} has no jobs and no worker serves it{_did_you_mean(queue, known)}; "
        f"to {verb} it anyway (ahead of a deploy that brings its workers), pass --force"
    )


def _did_you_mean(queue: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(queue, sorted(names), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = operator_command(
        sub, common, "queues",
        "per-queue counts and limits; pause, resume or limit a queue everywhere", DESCRIPTION,
        EXAMPLES,
    )  # fmt: skip
    p.add_argument(
        "action",
        nargs="?",
        choices=("pause", "resume", "limit"),
        help="pause, resume or limit QUEUE",
    )
    p.add_argument("queue", nargs="?", metavar="QUEUE", help="the queue to act on")
    p.add_argument(
        "--force",
        action="store_true",
        help="pause or limit a queue that nobody uses yet (no jobs, no worker serving it)",
    )
    limits.add_flags(p)
    p.set_defaults(func=cmd_queues)
