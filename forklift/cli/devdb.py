"""`forklift devdb`: the project's development database (forklift.devdb)."""

from __future__ import annotations

import argparse
import os
import subprocess

from forklift import devdb

DESCRIPTION = """\
With no database URL set (--dsn, FORKLIFT_DATABASE_URL, DATABASE_URL) and the embedded
extra installed, forklift uses a PostgreSQL 18 of the project's own, kept in ./.forklift
(FORKLIFT_HOME names another directory). The first command that needs it starts it,
and migrates each app's schema on first use; it stops when the last one exits. It is
refused in Kubernetes, under systemd and with FORKLIFT_ENV=production;
FORKLIFT_DEVDB=off turns it off.
"""
EXAMPLES = """\
examples:
  forklift devdb status      # where it is, whether it runs, its URL
  forklift devdb psql        # a psql session on it (kept running while psql is open)
  forklift devdb stop        # stop it now (it also stops when its last user exits)
  rm -r .forklift            # after a stop: forget everything in it
"""

STATUS_EXAMPLES = """\
examples:
  forklift devdb status
  FORKLIFT_HOME=../shared/.forklift forklift devdb status   # another project's
"""

STOP_EXAMPLES = """\
examples:
  forklift devdb stop
  forklift devdb stop && rm -r .forklift   # and forget everything in it
"""

PSQL_EXAMPLES = """\
examples:
  forklift devdb psql
  forklift devdb psql -- -c 'select queue, state, count(*) from forklift.jobs group by 1, 2'
"""


def cmd_status(args: argparse.Namespace) -> int:
    place = devdb.Place(devdb.home())
    print(f"directory   {devdb.shown(place.root)}")
    if not (place.data / "PG_VERSION").exists():
        print("state       not created yet: the first forklift command without a database URL")
        print("            creates and starts it")
        return 0
    pid = devdb.Server(place).pid()
    print(f"state       {'running, pid ' + str(pid) if pid else 'stopped'}")
    print(f"url         {place.dsn}")
    print(f"size        {_size(place.data) / 2**20:.1f} MiB")
    reason = devdb.refusal()
    if reason is not None:
        print(f"note        {reason}")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    place = devdb.Place(devdb.home())
    if devdb.stop(place):
        print(f"stopped the development database in {devdb.shown(place.root)}")
    else:
        print(f"the development database in {devdb.shown(place.root)} is not running")
    return 0


def cmd_psql(args: argparse.Namespace) -> int:
    from forklift import embedded

    url = devdb.dsn()  # started if need be, and held while psql runs
    psql = embedded.bin_dir() / "psql"
    extra = args.psql_args[1:] if args.psql_args[:1] == ["--"] else args.psql_args
    return subprocess.run([str(psql), url, *extra], check=False).returncode


def _size(path: os.PathLike[str]) -> int:
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass  # a file the server removed meanwhile
    return total


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: list[argparse.ArgumentParser]
) -> None:
    p = sub.add_parser(
        "devdb",
        parents=common,
        help="the project's development database (used when no database URL is set)",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, func, summary, examples in (
        ("status", cmd_status, "where it is, whether it runs", STATUS_EXAMPLES),
        ("stop", cmd_stop, "stop it now (its data stays)", STOP_EXAMPLES),
        ("psql", cmd_psql, "a psql session on it", PSQL_EXAMPLES),
    ):
        a = actions.add_parser(
            name,
            parents=common,
            help=summary,
            epilog=examples,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        a.set_defaults(func=func)
    actions.choices["psql"].add_argument(
        "psql_args", nargs=argparse.REMAINDER, help="more arguments for psql, after --"
    )
