"""Command-line flags: each reads a FORKLIFT_* variable for its default, and says so."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import Any

from forklift._config import duration, env, label_list, positive_int, queue_list
from forklift.scheduler.config import SchedulerConfig
from forklift.supervisor.config import SupervisorConfig
from forklift.workers.config import WorkerConfig


def flag(
    p: argparse.ArgumentParser,
    name: str,
    parse: Callable[[str], Any],
    default: Any,
    help: str,
    *,
    shown: str | None = None,
    metavar: str | None = None,
    var: str | None = None,
) -> None:
    """A flag whose default comes from FORKLIFT_<FLAG> (or FORKLIFT_<var>); the help
    names both."""
    var = var or name.lstrip("-").replace("-", "_").upper()
    tail = f"env FORKLIFT_{var}"
    if shown or default is not None:
        tail += f"; default: {shown or default}"
    p.add_argument(
        name,
        type=parse,
        metavar=metavar,
        default=env(var, parse, default),
        help=f"{help} ({tail})",
    )


def boolean(text: str) -> bool:
    if text.lower() in ("1", "true", "yes", "on"):
        return True
    if text.lower() in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a yes/no value")


def autoscale(text: str) -> tuple[int, int]:
    low, sep, high = text.partition(":")
    try:
        pair = (int(low), int(high))
    except ValueError:
        pair = (0, 0)
    if not sep or not 1 <= pair[0] <= pair[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected MIN:MAX with 1 <= MIN <= MAX")
    return pair


def add_database(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dsn", help="PostgreSQL URL (env FORKLIFT_DATABASE_URL, DATABASE_URL)")
    p.add_argument(
        "--schema",
        default=env("SCHEMA", str, "forklift"),
        help="schema holding forklift's tables (env FORKLIFT_SCHEMA; default: forklift)",
    )


def add_session_database(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--session-dsn",
        help="PostgreSQL URL for session-level work (LISTEN, liveness and singleton locks, "
        "the supervisor's own statements) when --dsn goes through a pooler such as "
        "PgBouncer: a direct URL or a session-mode pool (env FORKLIFT_SESSION_DATABASE_URL; "
        "default: --dsn itself)",
    )


def operator_command(
    actions: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
    name: str,
    summary: str,
    description: str,
    examples: str,
) -> argparse.ArgumentParser:
    """An operator command: its --help text as written (what it does and the --json
    shape above the flags, the examples below them), --json, --dsn and --schema.
    `actions` is the subparsers it joins: the top level's (`queues`) or a group's (`jobs
    list`)."""
    p = actions.add_parser(
        name,
        parents=common,
        help=summary,
        description=description,
        epilog=examples,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (shape above)")
    add_database(p)
    return p


def add_logging(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--log-format",
        default=env("LOG_FORMAT", str, "auto"),
        choices=["auto", "json", "text"],
        help="logs: one JSON object per line, or text for people; auto is text on a "
        "terminal and JSON otherwise (env FORKLIFT_LOG_FORMAT; default: auto)",
    )
    p.add_argument(
        "--log-level",
        default=env("LOG_LEVEL", str, "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="log verbosity (env FORKLIFT_LOG_LEVEL; default: INFO)",
    )


def _add_labels(p: argparse.ArgumentParser) -> None:
    flag(
        p,
        "--labels",
        label_list,
        (),
        "comma-separated labels of this host (gpu,model-x): its workers also claim the "
        "jobs of tasks declared requires={...} with labels they all have, before others",
        shown="none",
    )


def add_worker(p: argparse.ArgumentParser) -> None:
    """How each worker process claims and runs jobs (`run` and `worker`)."""
    flag(
        p, "--queues", queue_list, ("default",), "comma-separated queues to serve", shown="default"
    )
    _add_labels(p)
    flag(
        p,
        "--concurrency",
        positive_int,
        1,
        "jobs at once per worker process (plain handlers on threads, async ones on its event"
        " loop); 1 for CPU-heavy work and for tiny jobs (a worker claims ahead as their"
        " measured times allow), more for I/O-bound jobs (hundreds for async handlers)",
    )
    flag(
        p,
        "--pool",
        positive_int,
        None,
        "database connections per worker process for handlers' ctx.transaction(), sync "
        "and async handlers together, on top of its own one for claims, renewals and "
        "completions",
        shown="min(concurrency, 8)",
    )
    flag(p, "--lease", duration, 30.0, "lease length; renewed every third of it", shown="30s")
    flag(
        p,
        "--effect-statement-timeout",
        duration,
        300.0,
        "how long one statement of a handler's inside ctx.transaction() may take, for a "
        "task with no timeout (a task's timeout bounds its own)",
        shown="5m",
    )
    flag(p, "--poll-interval", duration, 2.0, "fallback poll when no NOTIFY arrives", shown="2s")
    flag(
        p,
        "--grace",
        duration,
        30.0,
        "on SIGTERM, how long running jobs may finish before they are released",
        shown="30s",
    )
    _add_retention(p)
    p.add_argument(
        "--no-prefetch",
        action="store_true",
        default=env("NO_PREFETCH", boolean, False),
        help="claim only into free slots, never ahead of them (env FORKLIFT_NO_PREFETCH)",
    )
    p.add_argument(
        "--no-listen",
        action="store_true",
        default=env("NO_LISTEN", boolean, False),
        help="do not LISTEN for new jobs; poll only (env FORKLIFT_NO_LISTEN)",
    )


def _add_retention(p: argparse.ArgumentParser) -> None:
    """How long a worker's maintenance keeps finished jobs."""
    flag(
        p,
        "--retain-finished",
        duration,
        86400.0,
        "keep succeeded and cancelled jobs this long before pruning them",
        shown="1d",
    )
    flag(
        p,
        "--retain-dead",
        duration,
        7 * 86400.0,
        "keep dead jobs (for inspection and retry) this long before pruning them",
        shown="7d",
    )
    flag(
        p,
        "--batch-abandon-after",
        duration,
        3600.0,
        "finish a batch still filling this long after its last enqueue as abandoned (its "
        "producer died inside `with app.batch()`)",
        shown="1h",
    )


def add_processes(p: argparse.ArgumentParser) -> None:
    """How many worker processes `run` keeps, and when it recycles them."""
    flag(
        p, "--workers", positive_int, os.cpu_count() or 1, "worker processes", shown="the CPU count"
    )
    flag(p, "--max-jobs-per-child", positive_int, None, "recycle a worker after this many jobs")
    flag(
        p,
        "--max-memory-per-child",
        float,
        None,
        "recycle a worker whose RSS passes this many MiB after its job; kill it (and "
        "charge its jobs) past 1.5x",
        metavar="MIB",
    )
    flag(
        p,
        "--autoscale",
        autoscale,
        None,
        "scale between MIN and MAX workers by backlog and idleness; overrides --workers",
        metavar="MIN:MAX",
    )
    flag(
        p,
        "--autoscale-idle",
        duration,
        15.0,
        "with --autoscale, retire a worker after it idled this long",
        shown="15s",
    )


def add_policing(p: argparse.ArgumentParser) -> None:
    """When `run` kills a worker, and where it serves its metrics."""
    flag(
        p,
        "--child-timeout",
        duration,
        30.0,
        "kill a worker that has not reported for this long",
        shown="30s",
    )
    flag(
        p,
        "--refused-grace",
        duration,
        10.0,
        "at boot, exit 1 if the database refuses forklift (wrong password, no such role or "
        "database) for this long; later, such errors are logged and /readyz says why",
        shown="10s",
    )
    flag(
        p,
        "--kill-grace",
        duration,
        3.0,
        "SIGTERM-to-SIGKILL wait when killing a worker for a timeout, and after the shutdown grace",
        shown="3s",
    )
    flag(
        p,
        "--cancel-grace",
        duration,
        5.0,
        "how long a cancelled job's handler may run on (ctx.cancelled is set) before its "
        "worker is killed and replaced",
        shown="5s",
    )
    flag(
        p,
        "--metrics-addr",
        str,
        "127.0.0.1:9367",
        "serve /metrics (all workers as one), /healthz and /readyz here; 'off' to "
        "disable; port 0 picks a free one",
        metavar="HOST:PORT",
    )


def add_scheduling(p: argparse.ArgumentParser) -> None:
    """How `run`'s scheduler enqueues the app's periodic jobs."""
    flag(
        p,
        "--schedule-ahead",
        duration,
        3.0,
        "enqueue a schedule's job this long before its fire time (it runs at that time); "
        "at least a second, the scheduler's round",
        shown="3s",
    )


def worker_config(args: argparse.Namespace) -> WorkerConfig:
    return WorkerConfig(
        queues=args.queues,
        labels=args.labels,
        concurrency=args.concurrency,
        lease=args.lease,
        effect_statement_timeout=args.effect_statement_timeout,
        poll_interval=args.poll_interval,
        grace=args.grace,
        listen=not args.no_listen,
        prefetch=not args.no_prefetch,
        pool=args.pool,
        keep_finished=args.retain_finished,
        keep_dead=args.retain_dead,
        batch_abandon_after=args.batch_abandon_after,
    )


def supervisor_config(args: argparse.Namespace) -> SupervisorConfig:
    return SupervisorConfig(
        workers=args.workers,
        worker=worker_config(args),
        max_jobs_per_child=args.max_jobs_per_child,
        max_memory_per_child=args.max_memory_per_child,
        autoscale=args.autoscale,
        autoscale_idle=args.autoscale_idle,
        child_timeout=args.child_timeout,
        kill_grace=args.kill_grace,
        cancel_grace=args.cancel_grace,
        refused_grace=args.refused_grace,
        metrics_addr=None if args.metrics_addr in ("", "off") else args.metrics_addr,
        scheduler=SchedulerConfig(ahead=args.schedule_ahead),
    )
