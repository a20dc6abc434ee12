"""`forklift schedules --json`: the documented shape, built from a row."""

from __future__ import annotations

from datetime import UTC, datetime

from forklift.cli.schedules import DESCRIPTION
from forklift.scheduler.schedule import format_every
from forklift.scheduler.store import ScheduleRow
from forklift.shown.schedules import as_json

WHEN = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)


def row(**changes: object) -> ScheduleRow:
    values: dict[str, object] = dict(
        name="nightly", task="reindex", queue="default", cron="0 2 * * *",
        every_seconds=None, tz="Europe/Zagreb", catchup_seconds=None, overlap=True,
        definition_hash="abc", created_at=WHEN, defined_at=WHEN, next_fire_at=WHEN,
        last_fire_at=None, last_job_id=None, last_success_at=None, last_error=None,
        last_error_at=None, in_flight=0, seen_ago=0.5,
    )  # fmt: skip
    values.update(changes)
    return ScheduleRow(**values)  # type: ignore[arg-type]


def test_the_json_shape_is_the_documented_one() -> None:
    shown = as_json(row())
    assert shown["next_fire"] == "2026-03-29T03:00:00+02:00"  # in its zone: CEST
    assert shown["next_fire_utc"] == "2026-03-29T01:00:00Z"
    assert shown["declared"] is True and shown["last_success_utc"] is None
    for key in shown:
        assert key in DESCRIPTION, f"{key} is not documented in --help"
    assert as_json(row(seen_ago=3600.0))["declared"] is False


def test_intervals_read_as_people_write_them() -> None:
    assert [format_every(s) for s in (1, 90, 300, 5400, 86400)] == [
        "1s", "1m30s", "5m", "1h30m", "1d",
    ]  # fmt: skip
