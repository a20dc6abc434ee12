"""`forklift schedules`: every schedule's next fire, last fire, last success and last error.

An operator command: it reads the schedules table, which every supervisor's scheduler
keeps, so it needs only the database, not the app.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from forklift.cli import flags
from forklift.cli.apps import app_for
from forklift.scheduler.schedule import format_every
from forklift.shown import output
from forklift.shown.schedules import DECLARED_WITHIN, as_json, zone

if TYPE_CHECKING:
    from forklift.scheduler.store import ScheduleRow

DESCRIPTION = """\
List every schedule the supervisors' schedulers have declared: its timing, its next
fire time (in its zone and in UTC), its last fire, its job's last success and last
error. A schedule that no running supervisor declares any more (removed from the code,
or no supervisor up) shows how long ago one last did.

--json prints a list with one object per schedule, with these keys (times are ISO 8601;
null when there is none yet): name, task, queue, cron (or null), every_seconds (or
null), tz, catchup_seconds (null: only the most recent missed fire runs), overlap,
definition_hash, defined_at, next_fire (in tz), next_fire_utc, last_fire_utc,
last_job_id, last_success_utc, last_error, last_error_utc, in_flight (fires whose job
has not finished), declared (a running supervisor declares it), synced_seconds_ago.
"""

EXAMPLES = """\
examples:
  forklift schedules
  forklift schedules --dsn postgresql://app@db.internal/app --schema forklift
  forklift schedules --json | jq '.[] | select(.last_error != null) | .name'
"""


def _ago(t: datetime | None, now: datetime) -> str:
    return "-" if t is None else f"{output.age(max(0.0, (now - t).total_seconds()))} ago"


def _cells(row: ScheduleRow, now: datetime) -> tuple[str, ...]:
    local = zone(row.tz)
    when = row.cron if row.cron is not None else f"every {format_every(row.every_seconds or 0)}"
    nxt = row.next_fire_at
    error = "-"
    if row.last_error is not None:
        error = f"{_ago(row.last_error_at, now)}: {output.clip(row.last_error, 40)}"
    status = "ok"
    if row.seen_ago > DECLARED_WITHIN:
        status = f"not declared for {output.age(row.seen_ago)}"
    return (
        row.name,
        row.task,
        when,
        row.tz,
        "-" if nxt is None else f"{nxt.astimezone(local):%Y-%m-%d %H:%M:%S %Z}",
        "-" if nxt is None else f"{nxt.astimezone(UTC):%Y-%m-%d %H:%M:%SZ}",
        _ago(row.last_fire_at, now),
        _ago(row.last_success_at, now),
        error,
        status,
    )


def cmd_schedules(args: argparse.Namespace) -> int:
    from forklift import _db
    from forklift.scheduler.store import ScheduleStore

    app = app_for(args)
    rows = ScheduleStore(app.dsn, app.schema, _db.Timeouts()).schedule_list()
    if args.json:
        output.print_json([as_json(r) for r in rows])
        return 0
    now = datetime.now(UTC)
    header = (
        "schedule", "task", "when", "zone", "next fire", "next fire (UTC)", "last fire",
        "last success", "last error", "status",
    )  # fmt: skip
    output.table(header, [_cells(r, now) for r in rows], empty="no schedules")
    return 0


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    p = sub.add_parser(
        "schedules",
        parents=common,
        help="periodic jobs: next fire, last fire, last success and last error of each",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (shape above)")
    flags.add_database(p)
    p.set_defaults(func=cmd_schedules)
