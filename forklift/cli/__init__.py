"""The `forklift` command line: one module per group of commands, main() here.

argparse, not click or typer: it is in the standard library (one dependency fewer for a
daemon that ships into containers), and `flags.flag()` gives every flag its FORKLIFT_*
variable and default in one place, which is all the framework this CLI needs.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import forklift
from forklift import _display, _logging
from forklift._redact import redact
from forklift.cli import flags
from forklift.cli.errors import Exit, handled, report
from forklift.errors import ForkliftError

EPILOG = """\
The database comes from --dsn, then FORKLIFT_DATABASE_URL, then DATABASE_URL; with
none, the project's development database in ./.forklift (forklift devdb --help).
Every flag also reads a FORKLIFT_* environment variable, named in its help.
Exit codes: 0 ok, 1 error, 2 usage (or a database URL that does not parse), 3 the app
does not import, 130 interrupted.

examples:
  forklift demo                # the whole thing at work, on an embedded PostgreSQL
  forklift migrate --dsn postgresql://localhost/app
  forklift run myproject.jobs:app --workers 4
  forklift enqueue myproject.jobs:app render --args '{"path": "a.png"}'
  forklift status
  forklift jobs list --state dead
"""

# The modules of forklift.cli that register the commands, in --help's order.
COMMAND_GROUPS = (
    "produce", "processes", "observe", "jobs", "batches", "workflows", "queues", "top",
    "schedules", "dashboard", "demo", "devdb",
)  # fmt: skip
# The group that registers each command: `forklift run ...` imports and builds its own
# group only (all of them take ~20 ms on the way to the first claim); --help, --version
# and a mistyped command get all of them.
GROUP_OF = {
    "migrate": "produce", "enqueue": "produce", "run": "processes", "worker": "processes",
    "status": "observe", "ps": "observe", "jobs": "jobs", "batches": "batches",
    "workflows": "workflows", "queues": "queues", "top": "top", "schedules": "schedules",
    "dashboard": "dashboard", "demo": "demo", "devdb": "devdb",
}  # fmt: skip


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The command line's parser: every command's, or only `command`'s group's."""
    parser = argparse.ArgumentParser(
        prog="forklift",
        description="forklift: a PostgreSQL-backed durable job queue with a prefork supervisor.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"forklift {forklift.__version__}")
    common = argparse.ArgumentParser(add_help=False)
    flags.add_logging(common)
    common.add_argument("--debug", action="store_true", help="on an error, show the traceback too")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    group = GROUP_OF.get(command or "")
    for name in COMMAND_GROUPS if group is None else (group,):
        importlib.import_module(f"forklift.cli.{name}").register(sub, [common])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser(argv[0] if argv else None)
        args = parser.parse_args(argv)
    except ForkliftError as exc:  # a bad FORKLIFT_* variable
        print(f"forklift: error: {_display.line(redact(str(exc)))}", file=sys.stderr)
        return Exit.USAGE
    # Daemons log to stdout (journald, kubectl logs); one-shot commands keep stdout for
    # their answer and log to stderr.
    daemon = args.command in ("run", "worker", "dashboard")
    _logging.setup(args.log_level, args.log_format, sys.stdout if daemon else sys.stderr)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        print("forklift: interrupted", file=sys.stderr)
        return Exit.INTERRUPTED
    except BrokenPipeError:  # `forklift ... | head`: the reader is gone, which is no error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return Exit.OK
    except Exception as exc:
        if not handled(exc):
            raise
        return report(exc, debug=args.debug)


if __name__ == "__main__":
    sys.exit(main())
