"""Declaring schedules: everything wrong fails at declaration, with a ConfigError."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import forklift
from forklift.scheduler.fire_times import Cron, Every


def handler(ctx: forklift.JobContext) -> None:
    pass


def test_decorating_registers_a_task_and_its_schedule() -> None:
    app = forklift.App("postgresql://nowhere/x")

    @app.periodic(cron="0 3 * * *", tz="Europe/Zagreb", name="nightly-reindex", queue="slow")
    def reindex(ctx: forklift.JobContext, *, full: bool = False) -> None:
        pass

    assert app.tasks["reindex"] is reindex
    assert reindex.queue == "slow"
    nightly = app.schedules["nightly-reindex"]
    assert (nightly.task, nightly.queue, nightly.tz, nightly.cron) == (
        "reindex", "slow", "Europe/Zagreb", "0 3 * * *",
    )  # fmt: skip
    assert isinstance(nightly.times, Cron)


def test_a_registered_task_can_be_scheduled_by_decorator_by_object_and_by_name() -> None:
    app = forklift.App("postgresql://nowhere/x")

    @app.periodic(every=timedelta(minutes=5))
    @app.task(name="sync", max_attempts=2)
    def sync(ctx: forklift.JobContext, *, region: str = "eu") -> None:
        pass

    by_object = app.periodic(task=sync, name="sync-us", every=60, args={"region": "us"})
    by_name = app.periodic(task="sync", name="sync-ap", cron="*/5 * * * *", max_attempts=4)
    assert app.schedules["sync"].every == 300
    assert isinstance(app.schedules["sync"].times, Every)
    assert (by_object.args, by_object.max_attempts) == ('{"region":"us"}', 2)
    assert (by_name.task, by_name.max_attempts) == ("sync", 4)
    assert list(app.tasks) == ["sync"]


def test_the_task_name_and_options_may_differ_from_the_function() -> None:
    app = forklift.App("postgresql://nowhere/x")
    task = app.periodic(every=60, task_name="tick", timeout=5.0, name="ticker")(handler)
    assert (task.name, task.timeout) == ("tick", 5.0)
    assert app.schedules["ticker"].timeout == 5.0


BAD: list[tuple[dict[str, Any], str]] = [
    ({"cron": "61 * * * *"}, "Bad minute"),
    ({"cron": "0 3 * *"}, "expected 5 fields"),
    ({"cron": "0 0 31 2 *"}, "Bad day-of-month"),
    ({"cron": "0 3 * * *", "tz": "Europe/Atlantis"}, "unknown time zone"),
    ({"cron": "0 3 * * *", "every": 60}, "exactly one of"),
    ({}, "exactly one of"),
    ({"every": 1.5}, "whole number of seconds"),
    ({"every": timedelta(0)}, "must be positive"),
    ({"every": 60, "tz": "Europe/Zagreb"}, "aligned to the Unix epoch"),
    ({"every": 60, "catchup": -1}, "catchup= must be positive"),
    ({"every": 60, "name": "bad\nname"}, "control character"),
    ({"every": 60, "name": ""}, "must not be empty"),
    ({"every": 60, "queue": "q\x00"}, "control character"),
    ({"every": 60, "args": {"nope": 1}}, "unknown argument 'nope'"),
    ({"every": 60, "args": {"x": float("nan")}}, "NaN"),
]


@pytest.mark.parametrize(("options", "message"), BAD, ids=[m for _, m in BAD])
def test_a_bad_schedule_fails_at_declaration(options: dict[str, Any], message: str) -> None:
    app = forklift.App("postgresql://nowhere/x")
    with pytest.raises(forklift.ConfigError, match=message):
        app.periodic(**options)(handler)
    assert app.tasks == {} and app.schedules == {}  # nothing left half-declared


def test_two_schedules_with_one_name_fail_at_the_second() -> None:
    app = forklift.App("postgresql://nowhere/x")
    app.periodic(every=60, name="tick")(handler)
    with pytest.raises(forklift.ConfigError, match="two schedules are named 'tick'"):
        app.periodic(task="handler", every=30, name="tick")
    assert list(app.schedules) == ["tick"]


def test_scheduling_a_task_the_app_does_not_have_fails() -> None:
    app = forklift.App("postgresql://nowhere/x")
    app.task(handler)
    with pytest.raises(forklift.ConfigError, match="no task of that name"):
        app.periodic(task="handlr", every=60)
    with pytest.raises(forklift.ConfigError, match=r"belong to @app\.task"):
        app.periodic(every=60, timeout=3.0)(app.tasks["handler"])


def test_the_definition_hash_changes_with_the_definition_only() -> None:
    def define(**options: Any) -> str:
        app = forklift.App("postgresql://nowhere/x")
        return app.periodic(task="t", name="s", **options).definition_hash

    base = define(every=60)
    assert base == define(every=60)
    assert base == define(every=timedelta(minutes=1))
    for changed in ({"every": 61}, {"every": 60, "args": {"a": 1}}, {"every": 60, "queue": "q"},
                    {"every": 60, "catchup": 5}, {"every": 60, "overlap": False},
                    {"cron": "* * * * *"}):  # fmt: skip
        assert define(**changed) != base


def test_the_idempotency_key_is_the_schedule_and_the_fire_time_in_utc() -> None:
    app = forklift.App("postgresql://nowhere/x")
    nightly = app.periodic(task="t", name="nightly", cron="0 2 * * *", tz="Europe/Zagreb")
    fire = datetime(2026, 3, 29, 1, tzinfo=UTC)
    assert nightly.key(fire) == "forklift:schedule:nightly:2026-03-29T01:00:00Z"
    assert nightly.interval(datetime(2026, 3, 29, 12, tzinfo=UTC)) == 23 * 3600.0
