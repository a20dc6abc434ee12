"""The limits' side of `forklift queues` and `status`: what the flags of `queues limit Q`
parse to, and how the limits in force read (tables, --json, the task limits' lines)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from forklift.cli.errors import UsageError
from forklift.shown import output

if TYPE_CHECKING:
    from forklift.admin import LimitChange, LimitRow, QueueStats

NONE = "none"  # a flag's value that removes that one limit
INT_MAX = 2**31 - 1  # the limits table's integer columns
UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}
_RATE = re.compile(r"(\d+)/(\d+(?:\.\d+)?)?([smh])")
FLAGS = ("concurrency", "rate", "max_depth")


def count(text: str) -> int | None:
    """--concurrency and --max-depth: a whole number >= 1, or `none` (None)."""
    if text.strip().lower() == NONE:
        return None
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= INT_MAX:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a whole number from 1 to {INT_MAX}, or {NONE} to remove this "
            "limit (to stop claims from a queue, pause it)"
        )
    return value


def rate(text: str) -> tuple[int, float] | None:
    """--rate: `N/s`, `N/Ns` (`100/60s`), `N/m`, `N/h` (`N/Nm`, `N/Nh` too) as (starts,
    seconds), or `none` (None)."""
    if text.strip().lower() == NONE:
        return None
    match = _RATE.fullmatch(text.strip())
    starts = int(match[1]) if match else 0
    per = float(match[2] or 1) * UNITS[match[3]] if match else 0.0
    if not (1 <= starts <= INT_MAX and per > 0 and math.isfinite(per)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected N/s, N/Ns, N/m or N/h with N from 1 to {INT_MAX} and a "
            f"window longer than 0 (e.g. 10/s, 100/60s, 500/h), or {NONE} to remove this limit"
        )
    return starts, per


def add_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--concurrency",
        type=count,
        default=argparse.SUPPRESS,  # not given: absent, so `none` can say remove
        metavar="N",
        help=f"with limit: jobs of QUEUE running at once, across replicas ({NONE}: no limit)",
    )
    p.add_argument(
        "--rate",
        type=rate,
        default=argparse.SUPPRESS,
        metavar="N/s",
        help="with limit: jobs of QUEUE started in any window: N/s, N/Ns (100/60s), N/m, "
        f"N/h ({NONE}: no limit)",
    )
    p.add_argument(
        "--max-depth",
        type=count,
        default=argparse.SUPPRESS,
        metavar="N",
        help="with limit: jobs QUEUE may hold waiting (ready or scheduled); an enqueue past "
        f"it fails ({NONE}: no limit)",
    )
    p.add_argument("--clear", action="store_true", help="with limit: remove every limit of QUEUE")


def given(args: argparse.Namespace) -> list[str]:
    """The limit flags on the command line, as flags (`--max-depth`)."""
    named = [f"--{f.replace('_', '-')}" for f in FLAGS if f in vars(args)]
    return named + (["--clear"] if args.clear else [])


def change_of(args: argparse.Namespace) -> LimitChange | None:
    """What `queues limit` is to set; None for --clear. A command line that sets nothing,
    or mixes --clear with a limit, is a UsageError (checked before anything is read)."""
    limits = [f for f in FLAGS if f in vars(args)]
    if args.clear:
        if limits:
            raise UsageError("--clear removes every limit of the queue: give it alone")
        return None
    if not limits:
        raise UsageError(
            "queues limit: nothing to set; give --concurrency N, --rate N/s, --max-depth N "
            f"(or {NONE} to remove one), or --clear"
        )
    from forklift.admin import LimitChange  # `queues limit` connects next

    starts, per = getattr(args, "rate", None) or (None, None)
    return LimitChange(
        frozenset(limits),
        getattr(args, "concurrency", None),
        starts,
        per,
        getattr(args, "max_depth", None),
    )


def limit_json(queue: str, limit: LimitRow | None) -> dict[str, Any]:
    """`queues limit --json`: what is in force now."""
    return {"queue": queue, "action": "limit", **stats_json(limit)}


def stats_json(s: LimitRow | QueueStats | None) -> dict[str, Any]:
    """A queue's limits, as `queues --json`, `top --json` and `queues limit --json` give
    them (None: it has none)."""
    return {
        "concurrency": s.concurrency if s else None,
        "rate": s.rate if s else None,
        "per": s.per if s else None,
        "max_depth": s.max_depth if s else None,
        "rejected": s.rejected if s else 0,
    }


def in_force(queue: str, limit: LimitRow | None) -> str:
    """`emails: concurrency 4, 10/1s, max depth 10000`, or `emails: no limits`."""
    return f"{queue}: {limit.describe() if limit else 'no limits'}"


def cell(s: QueueStats) -> str:
    """A queue's LIMITS cell: its limits and the enqueues max_depth refused; `-`: none."""
    text = s.limits() or "-"
    return f"{text} ({s.rejected} rejected)" if s.rejected else text


def task_lines(limits: Sequence[LimitRow]) -> list[str]:
    """`task charge: concurrency 1 per account`, one line per limited task."""
    return [f"task {lim.name}: {lim.describe()}" for lim in limits if lim.scope == "task"]


def print_task_lines(lines: Sequence[str]) -> None:
    """The tasks' limits below a queue table, a blank line before them."""
    if lines:
        print()
    for line in lines:
        output.say(line)
