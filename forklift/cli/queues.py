"""`forklift queues [pause|resume Q]`: every queue's counts, and pausing claims everywhere."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Iterable
from typing import Any

from forklift.admin import AdminStore, PausedQueue, QueueStats, checked_queue
from forklift.cli import output
from forklift.cli.apps import app_for
from forklift.cli.errors import Refused, UsageError
from forklift.cli.flags import operator_command

DESCRIPTION = """\
Without an action: per queue, whether it is paused, its ready (due now), scheduled (due
later), running and dead jobs, how long the oldest ready job has waited, and the jobs
done and gone dead in the last minute.

pause Q: no worker of any replica claims from Q any more, from its next claim on (jobs
already running finish). Persisted in the database: it holds across restarts until
`resume Q`, which wakes the workers that serve Q at once. A queue may be paused before
it has any jobs. Pausing or resuming twice is not an error.

A queue nobody uses (no jobs ready, running or dead, none among the newest finished, no
registered process serving it) is refused, with the close names that are in use: it is
most likely a typo, and pausing it would leave the real queue running. --force pauses it
anyway: ahead of a deploy that brings its workers.

examples:
  forklift queues
  forklift queues pause emails
  forklift queues pause reports --force
  forklift queues resume emails

--json prints, without an action, a list with one object per queue: queue, paused,
paused_at (ISO 8601 UTC, or null), paused_by (user@host, or null), ready, scheduled,
running, dead, oldest_ready_age_seconds (or null), succeeded_last_minute,
dead_last_minute, succeeded_last_hour, dead_last_hour; with pause or resume, one object:
queue, action, changed (false: it was paused, or not paused, already).
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
    }


def cmd_queues(args: argparse.Namespace) -> int:
    app = app_for(args)
    admin = AdminStore(app.dsn, app.schema)
    if args.action is not None:
        return _act(admin, args)
    if args.queue is not None:
        raise UsageError(f"{args.queue!r}: name an action first: queues pause|resume QUEUE")
    stats = admin.queue_stats()
    paused = {p.queue: p for p in admin.queue_paused_list()}
    if args.json:
        output.print_json([as_json(s, paused.get(s.queue)) for s in stats])
        return 0
    header = (
        "queue", "paused", "ready", "scheduled", "running", "dead", "oldest ready",
        "done 1m", "dead 1m",
    )  # fmt: skip
    rows = [
        (
            s.queue, _paused(paused.get(s.queue)), s.ready, s.scheduled, s.running, s.dead,
            "-" if s.oldest_ready_age is None else output.age(s.oldest_ready_age),
            s.succeeded_last_minute, s.dead_last_minute,
        )
        for s in stats
    ]  # fmt: skip
    output.table(header, rows, empty="no queues: no jobs, none paused")
    return 0


def _paused(p: PausedQueue | None) -> str:
    return "-" if p is None else f"{output.age(p.paused_for)} ago by {p.paused_by}"


def _act(admin: AdminStore, args: argparse.Namespace) -> int:
    queue = args.queue
    if queue is None:
        raise UsageError(
            f"queues {args.action} needs the queue's name, e.g. queues {args.action} emails"
        )
    if args.action == "pause":
        if not args.force:
            _check_in_use(admin, queue)
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


def _check_in_use(admin: AdminStore, queue: str) -> None:
    """Refuse to pause a queue nobody uses (a typo, most likely), naming the close ones."""
    checked_queue(queue)  # a malformed name is refused for what is wrong with it
    known = admin.queue_known_list()
    if queue in known:
        return
    raise Refused(
        f"queue {queue!r} has no jobs and no worker serves it{_did_you_mean(queue, known)}; "
        "to pause it anyway (ahead of a deploy that brings its workers), pass --force"
    )


def _did_you_mean(queue: str, names: Iterable[str]) -> str:
    close = difflib.get_close_matches(queue, sorted(names), n=3, cutoff=0.6)
    return f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = operator_command(
        sub, common, "queues", "per-queue counts; pause or resume a queue's claims everywhere",
        DESCRIPTION,
    )  # fmt: skip
    p.add_argument("action", nargs="?", choices=("pause", "resume"), help="pause or resume QUEUE")
    p.add_argument("queue", nargs="?", metavar="QUEUE", help="the queue to pause or resume")
    p.add_argument(
        "--force",
        action="store_true",
        help="pause a queue that nobody uses yet (no jobs, no worker serving it)",
    )
    p.set_defaults(func=cmd_queues)
