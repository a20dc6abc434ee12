"""`forklift migrate` and `forklift enqueue`."""

from __future__ import annotations

import argparse
import json

from forklift._config import duration, positive_int
from forklift.cli import flags
from forklift.cli.apps import app_for
from forklift.cli.errors import UsageError
from forklift.errors import ForkliftError

MIGRATE_EXAMPLES = """\
examples:
  forklift migrate
  forklift migrate --dsn postgresql://app@db.internal/app --schema forklift
  FORKLIFT_DATABASE_URL=postgresql://localhost/app forklift migrate
"""

ENQUEUE_EXAMPLES = """\
examples:
  forklift enqueue myproject.jobs:app render --args '{"path": "a.png", "width": 640}'
  forklift enqueue myproject.jobs:app render --args '{"path": "a.png"}' --key render-a --delay 5m
  forklift enqueue myproject.jobs:app reindex --queue maintenance --priority 10
  forklift enqueue myproject.jobs:app render --args '{"path": "b.png"}' --wait 60
"""


def cmd_migrate(args: argparse.Namespace) -> int:
    app = app_for(args)
    applied = app.migrate()
    if applied:
        print(f"applied migrations {', '.join(f'{v:04d}' for v in applied)} to {app.schema}")
    else:
        print(f"schema {app.schema} is up to date")
    return 0


def cmd_enqueue(args: argparse.Namespace) -> int:
    try:
        payload = json.loads(args.args)
    except json.JSONDecodeError as exc:
        raise UsageError(f"--args is not valid JSON: {exc}") from None
    except RecursionError:
        raise UsageError("--args is nested too deeply to be job arguments") from None
    if not isinstance(payload, dict):
        raise UsageError(
            '--args must be a JSON object of keyword arguments, e.g. {"path": "a.png"}'
        )
    app = app_for(args)
    job_id = app.enqueue(
        args.task,
        payload,
        idempotency_key=args.key,
        delay=args.delay,
        queue=args.queue,
        priority=args.priority,
        max_attempts=args.max_attempts,
        max_crashes=args.max_crashes,
    )
    print(job_id, flush=True)
    if args.wait is not None:
        try:
            result = app.result(job_id, timeout=args.wait)
        except TimeoutError:
            raise WaitedTooLong(
                f"job {job_id} did not end within {args.wait:g} s: "
                f"`forklift jobs show {job_id}` shows where it is"
            ) from None
        print(json.dumps(result))
    return 0


class WaitedTooLong(ForkliftError):
    """`enqueue --wait`: the job did not end in time (exit 1)."""


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], common: list[argparse.ArgumentParser]
) -> None:
    p = sub.add_parser(
        "migrate",
        parents=common,
        help="apply the schema (idempotent, safe to run concurrently)",
        epilog=MIGRATE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    flags.add_database(p)
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "enqueue",
        parents=common,
        help="enqueue one job",
        epilog=ENQUEUE_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("app", metavar="MODULE:APP", help="the app, e.g. myproject.jobs:app")
    p.add_argument("task", metavar="TASK", help="the task name")
    p.add_argument("--args", default="{}", help="keyword arguments as a JSON object")
    p.add_argument("--key", help="idempotency key: enqueueing the same key again adds nothing")
    p.add_argument("--delay", type=duration, help="start no sooner than this (e.g. 10s, 5m)")
    p.add_argument("--queue", help="override the task's queue")
    p.add_argument("--priority", type=int, help="override the task's priority (higher first)")
    p.add_argument("--max-attempts", type=positive_int, help="override the task's max_attempts")
    p.add_argument(
        "--max-crashes", type=positive_int, help="override the task's max_crashes (worker deaths)"
    )
    p.add_argument(
        "--wait",
        nargs="?",
        type=duration,
        const=30.0,
        metavar="SECONDS",
        help="then wait for the job's end and print its result as JSON (default 30 s); "
        "exit 1 if it failed, was cancelled or did not end in time",
    )
    flags.add_database(p)
    p.set_defaults(func=cmd_enqueue)
