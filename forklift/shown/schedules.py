"""How a schedule reads in `--json`, and when it counts as declared."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from forklift.shown import output

if TYPE_CHECKING:
    from forklift.scheduler.store import ScheduleRow

# A schedule no scheduler has synced for this long is no longer declared by a running
# supervisor (removed from the code, or every supervisor is down).
DECLARED_WITHIN = 60.0


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def as_json(row: ScheduleRow) -> dict[str, Any]:
    """One schedule in `--json`'s documented shape."""
    local = row.next_fire_at.astimezone(zone(row.tz)) if row.next_fire_at else None
    return {
        "name": row.name,
        "task": row.task,
        "queue": row.queue,
        "cron": row.cron,
        "every_seconds": row.every_seconds,
        "tz": row.tz,
        "catchup_seconds": row.catchup_seconds,
        "overlap": row.overlap,
        "definition_hash": row.definition_hash,
        "defined_at": output.utc(row.defined_at),
        "next_fire": None if local is None else local.isoformat(),
        "next_fire_utc": output.utc(row.next_fire_at),
        "last_fire_utc": output.utc(row.last_fire_at),
        "last_job_id": row.last_job_id,
        "last_success_utc": output.utc(row.last_success_at),
        "last_error": row.last_error,
        "last_error_utc": output.utc(row.last_error_at),
        "in_flight": row.in_flight,
        "declared": row.seen_ago <= DECLARED_WITHIN,
        "synced_seconds_ago": round(row.seen_ago, 3),
    }
