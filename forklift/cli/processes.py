"""`forklift run` (the supervisor) and `forklift worker` (one process, no supervisor)."""

from __future__ import annotations

import argparse
import os

from forklift import _loading
from forklift.cli import flags
from forklift.cli.apps import app_for

RUN_DESCRIPTION = """\
Import the app once, fork worker processes, restart the ones that crash, record how
they died on the jobs they held, and stop gracefully on SIGTERM. Signals: TERM/INT
graceful stop (second INT or QUIT: release now and exit); HUP rolling restart with
freshly imported code; TTIN/TTOU one worker more/fewer.
"""

RUN_EXAMPLES = """\
examples:
  forklift run myproject.jobs:app
  forklift run myproject.jobs:app --workers 4 --queues default,emails
  forklift run myproject.jobs:app --autoscale 2:8 --max-memory-per-child 512
  forklift run myproject.jobs:app --metrics-addr 0.0.0.0:9367 --grace 60s
"""

WORKER_EXAMPLES = """\
examples:
  forklift worker myproject.jobs:app
  forklift worker myproject.jobs:app --queues emails --concurrency 8 --log-level DEBUG
  forklift worker myproject.jobs:app --no-listen --poll-interval 1s
"""


def _use_session_dsn(args: argparse.Namespace) -> None:
    # One place says where session-level work goes (_db.session_dsn), for this process
    # and the workers it forks: the environment.
    from forklift._db import SESSION_URL_ENV

    if args.session_dsn:
        os.environ[SESSION_URL_ENV] = args.session_dsn


def cmd_worker(args: argparse.Namespace) -> int:
    from forklift.supervisor.standalone import StandaloneWorker

    _use_session_dsn(args)
    return StandaloneWorker(app_for(args), flags.worker_config(args)).run()


def cmd_run(args: argparse.Namespace) -> int:
    from forklift.supervisor import Supervisor
    from forklift.supervisor.reload import reimport
    from forklift.workers.slots import check_costs

    # An app that does not import stops here (exit 3), before any fork would loop on it.
    app = _loading.load_app(args.app)
    if args.dsn:
        app._dsn = args.dsn
    app.dsn  # noqa: B018 - fail now, not in every child, when no database is configured
    _use_session_dsn(args)
    config = flags.supervisor_config(args)
    check_costs(app, config.worker)  # here, not in a crash loop of every child
    return Supervisor(app, config, app_target=args.app, reimport=reimport).run()


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = sub.add_parser(
        "run",
        parents=common,
        help="the supervisor: fork worker processes and keep them healthy (foreground)",
        description=RUN_DESCRIPTION,
        epilog=RUN_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myproject.jobs:app")
    flags.add_processes(p)
    flags.add_policing(p)
    flags.add_scheduling(p)
    flags.add_worker(p)
    flags.add_database(p)
    flags.add_session_database(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "worker",
        parents=common,
        help="one worker process in the foreground (no supervisor; for debugging)",
        epilog=WORKER_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myproject.jobs:app")
    flags.add_worker(p)
    flags.add_database(p)
    flags.add_session_database(p)
    p.set_defaults(func=cmd_worker)
