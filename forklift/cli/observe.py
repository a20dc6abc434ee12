"""`forklift status` and `forklift ps`: what the queues and the processes are doing."""

from __future__ import annotations

import argparse

from forklift.admin import AdminStore
from forklift.cli import flags, output
from forklift.cli.apps import app_for


def cmd_status(args: argparse.Namespace) -> int:
    app = app_for(args)
    stats = AdminStore(app.dsn, app.schema).queue_stats()
    if args.json:
        output.print_json([vars(s) for s in stats])
        return 0
    header = (
        "queue", "paused", "ready", "scheduled", "running", "dead", "oldest ready",
        "done 1m", "dead 1m", "done 1h", "dead 1h",
    )  # fmt: skip
    rows = [
        (
            s.queue,
            "yes" if s.paused else "-",
            s.ready,
            s.scheduled,
            s.running,
            s.dead,
            "-" if s.oldest_ready_age is None else output.age(s.oldest_ready_age),
            s.succeeded_last_minute,
            s.dead_last_minute,
            s.succeeded_last_hour,
            s.dead_last_hour,
        )
        for s in stats
    ]
    output.table(header, rows, empty="no jobs")
    return 0


def cmd_ps(args: argparse.Namespace) -> int:
    app = app_for(args)
    admin = AdminStore(app.dsn, app.schema)
    procs = admin.process_list()
    paused = {q.queue for q in admin.queue_paused_list()}
    if args.json:
        shown = [{**vars(p), "paused_queues": [q for q in p.queues if q in paused]} for p in procs]
        output.print_json(shown)
        return 0
    header = ("host", "pid", "kind", "queues", "job", "uptime", "rss", "seen")
    rows = [
        (
            p.host,
            p.pid,
            p.kind if p.kind == "supervisor" else "  worker",
            ",".join(f"{q}(paused)" if q in paused else q for q in p.queues),
            p.current_job or "-",
            output.age(p.uptime),
            f"{p.rss_bytes / 2**20:.0f} MiB" if p.rss_bytes else "-",
            f"{p.heartbeat_age:.0f}s ago",
        )
        for p in procs
    ]
    output.table(header, rows, empty="no forklift processes registered")
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = sub.add_parser(
        "status",
        parents=common,
        help="queues: paused, ready, scheduled, running, dead, oldest age",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    flags.add_database(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("ps", parents=common, help="live supervisors and workers, all hosts")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    flags.add_database(p)
    p.set_defaults(func=cmd_ps)
