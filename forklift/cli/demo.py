"""`forklift demo`: the whole of forklift on show, on an embedded PostgreSQL by default."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from forklift._config import env, positive_int
from forklift.cli import flags

DESCRIPTION = """\
forklift demo: the whole of forklift on show, in under a minute on two cores.

It renders a Mandelbrot image as one batch of jobs, one per 32x32 tile (pure-Python
CPU work), with the real supervisor: `forklift run --workers N` forks one worker
process per core. Each worker stores its tile in the same transaction that completes
the tile's job. Halfway through, the demo SIGKILLs a worker in the middle of a tile:
the supervisor charges that job with how its worker died, starts a new worker, and the
tile is rendered again. When every tile's job has ended the batch finishes and its
callback job runs, once: it reads the tiles back from the database and writes the PNG,
each tile tinted by the worker process that rendered it, with a caption strip below
saying which tint is which worker, what was killed, and the effects' count. At the end
a table says whether every effect committed exactly once (one row per tile and one for
the callback: the tables have no unique constraint, so a doubled effect would show).

With no database URL it runs on an embedded PostgreSQL, deleted afterwards; it
never touches a server nobody named. With one, it works in a schema of its own
(forklift_demo_<hex>) and drops it afterwards. Ctrl-C stops everything it started.

Exit status: 0 if every tile's effect and the callback's committed exactly once, 1 if
not (or the callback failed), 130 on Ctrl-C or SIGTERM.
"""

EXAMPLES = """\
examples:
  forklift demo
  forklift demo --workers 4 --size 1280x960 --out /tmp/mandelbrot.png
  forklift demo --dsn postgresql://localhost/test --no-kill
"""


def size(text: str) -> tuple[int, int]:
    """WIDTHxHEIGHT, each 16 to 4096 pixels."""
    w, sep, h = text.lower().partition("x")
    try:
        pair = (int(w), int(h))
    except ValueError:
        pair = (0, 0)
    if not sep or not all(16 <= n <= 4096 for n in pair):
        raise argparse.ArgumentTypeError(f"{text!r}: expected WIDTHxHEIGHT, each 16 to 4096")
    return pair


def cmd_demo(args: argparse.Namespace) -> int:
    # Imported here: rich and the demo app cost the other commands nothing.
    from forklift.demo.run import Options, run

    if args.log_level != "DEBUG":
        # The demo tells its own story on stdout; its process's INFO lines (server
        # started, schema migrated) would only repeat it on stderr.
        logging.getLogger("forklift").setLevel(logging.WARNING)
    width, height = args.size
    return run(Options(args.dsn, args.workers, width, height, not args.no_kill, args.out))


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: list[argparse.ArgumentParser]
) -> None:
    p = sub.add_parser(
        "demo",
        parents=common,
        help="the whole thing on show, on an embedded PostgreSQL",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dsn",
        help="PostgreSQL URL to run in, in a schema of its own (env FORKLIFT_DATABASE_URL, "
        "DATABASE_URL; default: an embedded PostgreSQL)",
    )
    flags.flag(
        p,
        "--workers",
        positive_int,
        os.cpu_count() or 1,
        "worker processes",
        shown="the CPU count",
        var="DEMO_WORKERS",
    )
    flags.flag(
        p,
        "--size",
        size,
        (640, 480),
        "image size in pixels",
        shown="640x480",
        metavar="WxH",
        var="DEMO_SIZE",
    )
    p.add_argument(
        "--no-kill",
        action="store_true",
        default=env("DEMO_NO_KILL", flags.boolean, False),
        help="do not SIGKILL a worker midway (env FORKLIFT_DEMO_NO_KILL)",
    )
    flags.flag(
        p,
        "--out",
        Path,
        Path("forklift-demo.png"),
        "where to write the PNG image",
        metavar="PATH",
        var="DEMO_OUT",
    )
    p.set_defaults(func=cmd_demo)
