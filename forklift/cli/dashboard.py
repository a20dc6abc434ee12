"""`forklift dashboard`: the web view, read-only unless asked; actions need a token.

An operator command: it needs only the database (--dsn, --schema), not the app. The
dashboard itself (Flask) is an optional extra and is imported only when this command
runs, so `forklift` starts as fast without it.
"""

from __future__ import annotations

import argparse
import os
import textwrap

from forklift._config import env
from forklift.cli import flags
from forklift.cli.apps import app_for
from forklift.cli.errors import UsageError
from forklift.errors import ConfigError, install_hint

INSTALL = install_hint("dashboard")
# install_hint's words, wrapped as the rest of --help with the command at a line's
# start, so that no line break falls inside it.
_EXTRA, _, _HOW = INSTALL.partition(": ")
NEEDS = f"Flask does not come with forklift itself: {_EXTRA}:\n" + textwrap.fill(
    f"{_HOW}.", 88, break_on_hyphens=False
)

DESCRIPTION = f"""\
Serve the dashboard: every queue (ready, scheduled, running, dead, oldest ready age,
paused, limits) with done and dead jobs per minute over the last hour, every supervisor
and worker on every host and what each runs, the latest dead jobs; /jobs with the
filters of `jobs list`, each job as `jobs show` tells it (secrets hidden), /batches,
/schedules and /processes. Numbers refresh every second without a reload. It needs only
the database, and reads it through the operator's queries (never a scan of the jobs
table).

Read-only unless --allow-actions: then retry, cancel, pause, resume, purge and batch
cancel are there, each a POST behind a login with the token in FORKLIFT_DASHBOARD_TOKEN
(at least 16 characters; never a flag, which `ps` would show) and a CSRF token, recorded
in the job's error history as by dashboard:NAME@ADDRESS and logged. With the token set,
every page asks for the login; --allow-actions without it is refused. Binding anything
but loopback without a token warns that anyone reaching the address can read it.

{NEEDS}
"""

EXAMPLES = """\
examples:
  forklift dashboard                          # http://127.0.0.1:8787/, read-only
  FORKLIFT_DASHBOARD_TOKEN=$(openssl rand -hex 16) forklift dashboard --allow-actions
  forklift dashboard --bind 0.0.0.0:8787      # with FORKLIFT_DASHBOARD_TOKEN set
  forklift dashboard --dsn postgresql://db.internal/app --schema forklift
"""


def cmd_dashboard(args: argparse.Namespace) -> int:
    from forklift.dashboard.config import TOKEN_ENV, DashboardConfig, parse_bind

    try:
        host, port = parse_bind(args.bind)
        config = DashboardConfig(host, port, args.allow_actions, os.environ.get(TOKEN_ENV) or None)
        config.checked()
    except ConfigError as exc:
        raise UsageError(str(exc)) from None
    try:
        from forklift.dashboard.server import serve
    except ModuleNotFoundError as exc:
        if exc.name not in ("flask", "jinja2", "werkzeug", "markupsafe", "itsdangerous"):
            raise
        raise UsageError(f"forklift dashboard: {exc.name} is not installed; {INSTALL}") from None
    app = app_for(args)
    return serve(config, app.dsn, app.schema)


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = sub.add_parser(
        "dashboard",
        parents=common,
        help="the web view: queues, jobs, batches, schedules, processes (read-only unless "
        "--allow-actions; needs the dashboard extra)",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flags.flag(
        p,
        "--bind",
        str,
        "127.0.0.1:8787",
        "where to serve the dashboard, HOST:PORT ([::1]:8787 for IPv6; port 0 picks a free one)",
        metavar="HOST:PORT",
        var="DASHBOARD_BIND",
    )
    p.add_argument(
        "--allow-actions",
        action="store_true",
        default=env("DASHBOARD_ALLOW_ACTIONS", flags.boolean, False),
        help="offer retry, cancel, pause, resume and purge, behind a login with "
        "FORKLIFT_DASHBOARD_TOKEN (env FORKLIFT_DASHBOARD_ALLOW_ACTIONS)",
    )
    flags.add_database(p)
    p.set_defaults(func=cmd_dashboard)
