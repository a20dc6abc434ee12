"""The `forklift` command line."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from types import FrameType
from typing import Any

import psycopg

from forklift import _config, _db, _logging
from forklift._config import duration, env, positive_int, queue_list
from forklift.app import App
from forklift.errors import ConfigError, ForkliftError
from forklift.supervisor.config import SupervisorConfig
from forklift.workers.config import WorkerConfig

log = logging.getLogger("forklift.cli")

EPILOG = """\
The database comes from --dsn, then FORKLIFT_DATABASE_URL, then DATABASE_URL.
Every flag also reads a FORKLIFT_* environment variable, named in its help.
"""


def _add_db(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="PostgreSQL URL (env FORKLIFT_DATABASE_URL, DATABASE_URL)")
    p.add_argument(
        "--schema",
        default=env("SCHEMA", str, "forklift"),
        help="schema holding forklift's tables (env FORKLIFT_SCHEMA; default: forklift)",
    )


def _app_for(args: argparse.Namespace) -> App:
    target = getattr(args, "app", None)
    if target:
        app = _config.load_app(target)
        if args.dsn:
            app._dsn = args.dsn
        return app
    return App(args.dsn, schema=args.schema)


def cmd_migrate(args: argparse.Namespace) -> int:
    app = _app_for(args)
    applied = app.migrate()
    if applied:
        print(f"applied migrations {', '.join(f'{v:04d}' for v in applied)} to {app.schema}")
    else:
        print(f"schema {app.schema} is up to date")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    app = _app_for(args)
    try:
        payload = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise ForkliftError(f"--args is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ForkliftError("--args must be a JSON object of keyword arguments")
    job_id = app.enqueue(
        args.task,
        payload,
        idempotency_key=args.key,
        delay=args.delay,
        queue=args.queue,
        priority=args.priority,
    )
    print(job_id)
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    from forklift.workers import Worker

    app = _app_for(args)
    worker = Worker(app, _worker_config(args))

    def on_signal(signum: int, frame: FrameType | None) -> None:
        # Only flag and wake: the loop does the work (a second INT or any QUIT: fast).
        fast = signum == signal.SIGQUIT or (signum == signal.SIGINT and worker.stopping)
        worker.request_stop(fast=fast)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, on_signal)
    worker.run()
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from forklift.admin import AdminStore

    app = _app_for(args)
    stats = AdminStore(app.dsn, app.schema).queue_stats()
    if args.json:
        print(json.dumps([vars(s) for s in stats], indent=2))
        return 0
    header = ("queue", "ready", "scheduled", "running", "dead", "oldest ready", "done/min")
    rows = [
        (
            s.queue,
            s.ready,
            s.scheduled,
            s.running,
            s.dead,
            _age(s.oldest_ready_age),
            s.succeeded_last_minute,
        )
        for s in stats
    ]
    _table(header, rows, empty="no jobs")
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    from forklift.admin import AdminStore

    app = _app_for(args)
    procs = AdminStore(app.dsn, app.schema).process_list()
    if args.json:
        print(json.dumps([vars(p) for p in procs], indent=2))
        return 0
    header = ("host", "pid", "kind", "queues", "job", "uptime", "rss", "seen")
    rows = [
        (
            p.host,
            p.pid,
            p.kind if p.kind == "supervisor" else "  worker",
            ",".join(p.queues),
            p.current_job or "-",
            _age(p.uptime),
            f"{p.rss_bytes / 2**20:.0f} MiB" if p.rss_bytes else "-",
            f"{p.heartbeat_age:.0f}s ago",
        )
        for p in procs
    ]
    _table(header, rows, empty="no forklift processes registered")
    return 0


def _age(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _table(header: Sequence[str], rows: Sequence[Sequence[object]], *, empty: str) -> None:
    if not rows:
        print(empty)
        return
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def _autoscale(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        pair = (int(low), int(high))
    except ValueError:
        pair = (0, 0)
    if not sep or not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MIN:MAX with 1 <= MIN <= MAX")
    return pair


def _worker_config(args: argparse.Namespace) -> WorkerConfig:
    try:
        return WorkerConfig(
            queues=args.queues,
            concurrency=args.concurrency,
            lease=args.lease,
            poll_interval=args.poll_interval,
            grace=args.grace,
            listen=not args.no_listen,
            pool=args.pool,
        )
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def cmd_run(args: argparse.Namespace) -> int:
    from forklift.supervisor import Supervisor
    from forklift.supervisor.reload import reimport

    try:
        app = _config.load_app(args.app)
    except ForkliftError:
        raise
    except BaseException:
        # The app does not import: say why once and stop; forking would only loop.
        traceback.print_exc()
        print(f"forklift: error: could not import {args.app}", file=sys.stderr)
        return 3
    if args.dsn:
        app._dsn = args.dsn
    app.dsn  # noqa: B018 - fail now, not in every child, when no database is configured
    try:
        config = _supervisor_config(args)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return Supervisor(app, config, app_target=args.app, reimport=reimport).run()


def _supervisor_config(args: argparse.Namespace) -> SupervisorConfig:
    return SupervisorConfig(
        workers=args.workers,
        worker=_worker_config(args),
        max_jobs_per_child=args.max_jobs_per_child,
        max_memory_per_child=args.max_memory_per_child,
        autoscale=args.autoscale,
        autoscale_idle=args.autoscale_idle,
        child_timeout=args.child_timeout,
        kill_grace=args.kill_grace,
        metrics_addr=None if args.metrics_addr in ("", "off") else args.metrics_addr,
    )


def _flag(
    p: argparse.ArgumentParser,
    flag: str,
    parse: Callable[[str], Any],
    default: Any,
    help: str,
    *,
    shown: str | None = None,
    metavar: str | None = None,
) -> None:
    """A flag whose default comes from FORKLIFT_<FLAG>; the help names both."""
    name = flag.lstrip("-").replace("-", "_").upper()
    tail = f"env FORKLIFT_{name}"
    if shown or default is not None:
        tail += f"; default: {shown or default}"
    p.add_argument(
        flag,
        type=parse,
        metavar=metavar,
        default=env(name, parse, default),
        help=f"{help} ({tail})",
    )


def _boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a yes/no value")


def _add_worker_flags(p: argparse.ArgumentParser) -> None:
    _flag(
        p, "--queues", queue_list, ("default",), "comma-separated queues to serve", shown="default"
    )
    _flag(
        p,
        "--concurrency",
        positive_int,
        1,
        "handler threads per worker process; 1 for CPU-heavy work, more for I/O-bound or tiny jobs",
    )
    _flag(
        p,
        "--pool",
        positive_int,
        None,
        "database connections per worker process for handlers' ctx.transaction(), on "
        "top of 3 for claims, renewals and completions",
        shown="min(concurrency, 8)",
    )
    _flag(p, "--lease", duration, 30.0, "lease length; renewed every third of it", shown="30s")
    _flag(p, "--poll-interval", duration, 2.0, "fallback poll when no NOTIFY arrives", shown="2s")
    _flag(
        p,
        "--grace",
        duration,
        30.0,
        "on SIGTERM, how long running jobs may finish before they are released",
        shown="30s",
    )
    p.add_argument(
        "--no-listen",
        action="store_true",
        default=env("NO_LISTEN", _boolean, False),
        help="do not LISTEN for new jobs; poll only (env FORKLIFT_NO_LISTEN)",
    )


def _add_run_flags(p: argparse.ArgumentParser) -> None:
    _flag(
        p, "--workers", positive_int, os.cpu_count() or 1, "worker processes", shown="the CPU count"
    )
    _flag(p, "--max-jobs-per-child", positive_int, None, "recycle a worker after this many jobs")
    _flag(
        p,
        "--max-memory-per-child",
        float,
        None,
        "recycle a worker whose RSS passes this many MiB after its job; kill it (and "
        "charge its jobs) past 1.5x",
        metavar="MIB",
    )
    _flag(
        p,
        "--autoscale",
        _autoscale,
        None,
        "scale between MIN and MAX workers by backlog and idleness; overrides --workers",
        metavar="MIN:MAX",
    )
    _flag(
        p,
        "--autoscale-idle",
        duration,
        15.0,
        "with --autoscale, retire a worker after it idled this long",
        shown="15s",
    )
    _flag(
        p,
        "--child-timeout",
        duration,
        30.0,
        "kill a worker that has not reported for this long",
        shown="30s",
    )
    _flag(
        p,
        "--kill-grace",
        duration,
        3.0,
        "SIGTERM-to-SIGKILL wait when killing a worker for a timeout, and after the shutdown grace",
        shown="3s",
    )
    _flag(
        p,
        "--metrics-addr",
        str,
        "127.0.0.1:9090",
        "serve /metrics (all workers as one), /healthz and /readyz here; 'off' to "
        "disable; port 0 picks a free one",
        metavar="HOST:PORT",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="forklift",
        description="forklift: a PostgreSQL-backed durable job queue with a prefork supervisor.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", str, "json"),
        choices=["json", "text"],
        help="logs on stdout: one JSON object per line, or plain text "
        "(env FORKLIFT_LOG_FORMAT; default: json)",
    )
    common.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", str, "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log verbosity (env FORKLIFT_LOG_LEVEL; default: INFO)",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser(
        "migrate", parents=[common], help="apply the schema (idempotent, safe to run concurrently)"
    )
    _add_db(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser("enqueue", parents=[common], help="enqueue one job")
    p.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myproject.jobs:app")
    p.add_argument("task", metavar="TASK", help="the task name")
    p.add_argument("--args", default="{}", help="keyword arguments as a JSON object")
    p.add_argument("--key", help="idempotency key: enqueueing the same key again adds nothing")
    p.add_argument("--delay", type=duration, help="start no sooner than this (e.g. 10s, 5m)")
    p.add_argument("--queue", help="override the task's queue")
    p.add_argument("--priority", type=int, help="override the task's priority (higher first)")
    _add_db(p)
    p.set_defaults(func=cmd_enqueue)

    p = sub.add_parser(
        "run",
        parents=[common],
        help="the supervisor: fork worker processes and keep them healthy (foreground)",
        description="Import the app once, fork worker processes, restart the ones that crash, "
        "record how they died on the jobs they held, and stop gracefully on SIGTERM. "
        "Signals: TERM/INT graceful stop (second INT or QUIT: release now and exit); "
        "HUP rolling restart with freshly imported code; TTIN/TTOU one worker more/fewer.",
    )
    p.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myproject.jobs:app")
    _add_run_flags(p)
    _add_worker_flags(p)
    _add_db(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "status", parents=[common], help="queues: ready, scheduled, running, dead, oldest age"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_db(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ps", parents=[common], help="live supervisors and workers, all hosts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    _add_db(p)
    p.set_defaults(func=cmd_ps)

    p = sub.add_parser(
        "worker",
        parents=[common],
        help="one worker process in the foreground (no supervisor; for debugging)",
    )
    p.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myproject.jobs:app")
    _add_worker_flags(p)
    _add_db(p)
    p.set_defaults(func=cmd_worker)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except ForkliftError as exc:  # a bad FORKLIFT_* variable
        print(f"forklift: error: {_db.redact(str(exc))}", file=sys.stderr)
        return 2
    # Daemons log to stdout (journald, kubectl logs); one-shot commands keep stdout for
    # their answer and log to stderr.
    daemon = args.command in ("run", "worker")
    _logging.setup(args.log_level, args.log_format, sys.stdout if daemon else sys.stderr)
    try:
        return int(args.func(args))
    except (ForkliftError, psycopg.Error) as exc:
        print(f"forklift: error: {_db.redact(str(exc))}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
