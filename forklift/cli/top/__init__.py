"""`forklift top`: a live terminal view of every replica, refreshed each second.

An operator command: it reads the queues, the process registry and the jobs table, so it
needs only the database. `screen.py` runs it (rich, imported by this command only):
`frame.py` reads, `view.py` lays out, `terminal.py` reads keys.
"""

from __future__ import annotations

import argparse

from forklift.cli.flags import operator_command

DESCRIPTION = """\
A live view of every replica, refreshed each second: each queue's counts, with
sparklines of its depth (ready jobs) and rate (jobs done in the last minute) over the
last refreshes, whether it is paused, and its limits (on a terminal 90 columns wide or
more); every worker process on every host and what it runs, for how long, and how far it
says it is (ctx.progress: percent done, or the count when it gave no total, and its
message; and, after a circling arrow, how long ago its checkpoint was written, when it
has one); the most recent dead jobs. Keys: q quits (Ctrl-C does too). Fits an 80x24
terminal (over SSH too); a bigger one shows more rows.

--json prints one frame (and exits): an object with at (ISO 8601 UTC), error (null),
supervisors, queues (objects with queue, paused, ready, scheduled, running, dead,
oldest_ready_age_seconds, succeeded_last_minute, dead_last_minute, concurrency, rate,
per, max_depth, rejected: see `forklift queues --help`), workers (objects with
id, host, pid, registered, rss_bytes, jobs: objects with id, task, queue, attempt,
running_seconds, progress: done, total, message, at, or null, checkpoint_seconds_ago:
how long ago its checkpoint was written, or null: it has none), recent_failures (objects
with id, queue, task, seconds_ago, error).
"""

EXAMPLES = """\
examples:
  forklift top
  forklift top --once     # one frame on stdout, then exit (no terminal needed)
  forklift top --json | jq '.workers[] | select(.jobs != []) | .id'
"""


def cmd_top(args: argparse.Namespace) -> int:
    from forklift.cli.top.screen import top

    return top(args)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = operator_command(
        sub, common, "top", "a live terminal view across replicas: queues, workers, failures",
        DESCRIPTION, EXAMPLES,
    )  # fmt: skip
    p.add_argument("--once", action="store_true", help="print one frame and exit")
    p.set_defaults(func=cmd_top)
