"""`forklift status` and `forklift ps`: what the queues and the processes are doing."""

from __future__ import annotations

import argparse
from typing import Any

from forklift.cli import flags, limits
from forklift.cli.apps import admin_store, app_for, job_admin
from forklift.shown import output
from forklift.shown.processes import Listed, listed

STATUS_EXAMPLES = """\
examples:
  forklift status
  forklift status --dsn postgresql://app@db.internal/app
  forklift status --json | jq '.[] | select(.dead > 0) | .queue'
"""


def cmd_status(args: argparse.Namespace) -> int:
    app = app_for(args)
    admin = admin_store(app)
    with admin.connector.session("forklift status: reading failed"):
        stats = admin.queue_stats()
        tasks = limits.task_lines(admin.limit_list())
    if args.json:
        output.print_json([vars(s) for s in stats])
        return 0
    blocked = any(s.blocked for s in stats)  # a column only where workflows wait
    stuck = any(s.unrunnable for s in stats)  # a column only where labels are missing
    header = (
        "queue", "paused", "ready", "scheduled", "running", "dead",
        *(("blocked",) if blocked else ()), *(("no worker",) if stuck else ()), "oldest ready",
        "done 1m", "dead 1m", "done 1h", "dead 1h", "limits",
    )  # fmt: skip
    rows = [
        (
            s.queue,
            "yes" if s.paused else "-",
            s.ready,
            s.scheduled,
            s.running,
            s.dead,
            *((s.blocked,) if blocked else ()),
            *((s.unrunnable,) if stuck else ()),
            "-" if s.oldest_ready_age is None else output.age(s.oldest_ready_age),
            s.succeeded_last_minute,
            s.dead_last_minute,
            s.succeeded_last_hour,
            s.dead_last_hour,
            limits.cell(s),
        )
        for s in stats
    ]
    output.table(header, rows, empty="no jobs")
    limits.print_task_lines(tasks)
    if stuck:
        print(
            "\nno worker: ready jobs whose task requires labels (@app.task(requires=...)) "
            "that no registered worker of the queue has; start one with --labels"
        )
    return 0


PS_DESCRIPTION = """\
Every registered supervisor and worker process, on every host, with the jobs each
worker runs now (task#id), read from the jobs themselves as `forklift top` reads them
(the registry's heartbeat, every few seconds, gives the rest). A worker that runs jobs
before its registry row is written is listed too, as "not registered". The labels of a
process started with --labels follow its queues in brackets: default [gpu,model-x].

--json prints a list with one object per process: id, kind, host, pid, supervisor_id,
queues, labels, current_job (the first job it runs, or null), jobs (a list of objects with id,
task, queue), rss_bytes, uptime and heartbeat_age (seconds; null when not registered),
registered, paused_queues.
"""

PS_EXAMPLES = """\
examples:
  forklift ps
  forklift ps --json | jq '.[] | select(.kind == "worker") | .current_job'
  forklift ps --json | jq '[.[] | select(.registered | not)] | length'
"""


def ps_json(line: Listed, paused: set[str]) -> dict[str, Any]:
    p = line.process
    jobs = [{"id": j.id, "task": j.task, "queue": j.queue} for j in line.jobs]
    if p is None:
        return {
            "id": line.id, "kind": "worker", "host": line.host, "pid": line.pid,
            "supervisor_id": None, "queues": [], "labels": [], "current_job": line.jobs[0].id,
            "jobs": jobs,
            "rss_bytes": None, "uptime": None, "heartbeat_age": None, "registered": False,
            "paused_queues": [],
        }  # fmt: skip
    return {
        **vars(p),
        "current_job": line.jobs[0].id if line.jobs else None,
        "jobs": jobs,
        "registered": True,
        "paused_queues": [q for q in p.queues if q in paused],
    }


def ps_row(line: Listed, paused: set[str]) -> tuple[object, ...]:
    jobs = ", ".join(f"{j.task}#{j.id}" for j in line.jobs) or "-"
    p = line.process
    if p is None:
        queues = ",".join(sorted({j.queue for j in line.jobs}))
        return (line.host, line.pid, "  worker", queues, jobs, "-", "-", "not registered")
    queues = ",".join(f"{q}(paused)" if q in paused else q for q in p.queues)
    return (
        p.host,
        p.pid,
        p.kind if p.kind == "supervisor" else "  worker",
        f"{queues} [{','.join(p.labels)}]" if p.labels else queues,
        jobs,
        output.age(p.uptime),
        f"{p.rss_bytes / 2**20:.0f} MiB" if p.rss_bytes else "-",
        f"{p.heartbeat_age:.0f}s ago",
    )


def cmd_ps(args: argparse.Namespace) -> int:
    app = app_for(args)
    admin = admin_store(app)
    jobs = job_admin(app, admin)
    with admin.connector.session("forklift ps: reading failed"):
        lines = listed(admin.process_list(), jobs.job_running_list())
        paused = {q.queue for q in admin.queue_paused_list()}
    if args.json:
        output.print_json([ps_json(line, paused) for line in lines])
        return 0
    header = ("host", "pid", "kind", "queues", "job", "uptime", "rss", "seen")
    rows = [ps_row(line, paused) for line in lines]
    output.table(header, rows, empty="no forklift processes registered")
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = sub.add_parser(
        "status",
        parents=common,
        help="queues: paused, ready, scheduled, running, dead, oldest age, limits; jobs no "
        "worker has the labels for",
        epilog=STATUS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    flags.add_database(p)
    p.set_defaults(func=cmd_status)

    p = sub.add_parser(
        "ps",
        parents=common,
        help="live supervisors and workers, all hosts",
        description=PS_DESCRIPTION,
        epilog=PS_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    flags.add_database(p)
    p.set_defaults(func=cmd_ps)
