"""forklift.Snooze in one worker: a run given back to run again later, its attempt not
spent, counted apart and bounded by the task's max_snoozes; fenced like every outcome,
shown by `jobs show`. The kills are in tests/faults/test_snooze.py."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import forklift
from forklift.admin import JobAdmin
from forklift.dashboard import views
from forklift.shown import jobview
from forklift.store import JobStore, job_snooze_many
from forklift.testing import drain, inline, run_job, wait_for
from tests.integration.conftest import RunWorker, tallied

Conn = psycopg.Connection[Any]


def row(db: Conn, schema: str, job_id: int) -> dict[str, Any]:
    cursor = db.execute(
        f"SELECT state::text AS state, attempts, snoozes, snoozed_at, available_at, "
        f"started_at, errors, last_error, result, checkpoint FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    )
    found = cursor.fetchone()
    assert found is not None and cursor.description is not None
    return dict(zip([c.name for c in cursor.description], found, strict=True))


def ended(db: Conn, schema: str, job_id: int, state: str) -> dict[str, Any]:
    wait_for(lambda: row(db, schema, job_id)["state"] == state, timeout=20, what=f"job {state}")
    return row(db, schema, job_id)


def effect_keys(db: Conn, schema: str) -> list[str]:
    return [r[0] for r in db.execute(f"SELECT key FROM {schema}.effects ORDER BY key")]


def test_a_raised_snooze_runs_the_job_again_without_spending_an_attempt(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    attempts: list[int] = []

    def not_yet(ctx: forklift.JobContext) -> str:
        attempts.append(ctx.attempt)
        if len(attempts) <= 3:
            raise forklift.Snooze(0.05)
        return "ready at last"

    job_id = app.enqueue(task(not_yet, max_attempts=2))
    run_worker()
    done = ended(db, schema, job_id, "succeeded")
    assert attempts == [1, 1, 1, 1]  # every run was attempt 1: none was spent
    assert (done["attempts"], done["snoozes"]) == (1, 3)
    assert done["errors"] == [] and done["last_error"] is None  # a snooze is no failure
    assert done["result"] == "ready at last"


def test_the_metrics_count_each_snoozed_run_as_no_failure(
    app: forklift.App, db: Conn, schema: str, task: Callable[..., str]
) -> None:
    runs: list[int] = []

    def twice(ctx: forklift.JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) <= 2:
            raise forklift.Snooze(0)

    name = task(twice)
    job_id = app.enqueue(name)
    deltas = tallied(app, lambda: ended(db, schema, job_id, "succeeded"))
    counted = {(q, t, outcome): n for q, t, outcome, n in deltas["jobs"]}
    assert counted == {("default", name, "snoozed"): 2, ("default", name, "succeeded"): 1}


def test_a_returned_snooze_snoozes_the_same_way(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    runs: list[int] = []

    def wait_turn(ctx: forklift.JobContext) -> forklift.Snooze | int:
        runs.append(ctx.attempt)
        return forklift.Snooze(0) if len(runs) == 1 else 7

    job_id = app.enqueue(task(wait_turn))
    run_worker()
    done = ended(db, schema, job_id, "succeeded")
    assert (runs, done["attempts"], done["snoozes"], done["result"]) == ([1, 1], 1, 1, 7)


def test_the_next_run_waits_for_the_delay_on_the_database_clock(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    runs: list[int] = []

    def later(ctx: forklift.JobContext) -> None:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise forklift.Snooze(1.5)

    job_id = app.enqueue(task(later))
    run_worker()
    wait_for(lambda: row(db, schema, job_id)["snoozes"] == 1, what="the snooze recorded")
    snoozed = row(db, schema, job_id)
    assert snoozed["state"] in ("ready", "running", "succeeded")
    assert snoozed["available_at"] - snoozed["snoozed_at"] == timedelta(seconds=1.5)
    done = ended(db, schema, job_id, "succeeded")
    # Claimed again (started_at: the claim's clock, the database's) once due, not before,
    # and soon after: the snooze woke the idle worker, which slept until then.
    assert done["started_at"] >= snoozed["available_at"]
    assert done["started_at"] - snoozed["available_at"] < timedelta(seconds=1.0)
    assert (runs, done["attempts"]) == ([1, 1], 1)


def test_past_max_snoozes_a_run_is_a_failed_attempt_and_the_job_goes_dead(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    attempts: list[int] = []

    def never_ready(ctx: forklift.JobContext) -> None:
        attempts.append(ctx.attempt)
        raise forklift.Snooze(0)

    job_id = app.enqueue(task(never_ready, max_snoozes=2, max_attempts=2))
    run_worker()
    dead = ended(db, schema, job_id, "dead")
    # Two snoozes, then the third run fails attempt 1; the bound is the job's, not the
    # attempt's: attempt 2's first snooze is past it too, and it was the last attempt.
    assert attempts == [1, 1, 1, 2]
    assert (dead["attempts"], dead["snoozes"]) == (2, 2)
    error = "Snooze: snoozed 2 times, max_snoozes=2"
    assert [(e["attempt"], e["error"]) for e in dead["errors"]] == [(1, error), (2, error)]
    assert dead["last_error"] == error


def test_max_snoozes_zero_makes_every_snooze_a_failure(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    def impatient(ctx: forklift.JobContext) -> forklift.Snooze:
        return forklift.Snooze(60)

    job_id = app.enqueue(task(impatient, max_snoozes=0, max_attempts=1))
    run_worker()
    dead = ended(db, schema, job_id, "dead")
    assert (dead["snoozes"], dead["last_error"]) == (0, "Snooze: snoozed 0 times, max_snoozes=0")


def test_an_async_handler_snoozes_raised_and_returned(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    runs: list[int] = []

    async def awaiting(ctx: forklift.AsyncJobContext) -> str:
        runs.append(ctx.attempt)
        async with ctx.transaction() as conn:
            await conn.execute(
                f"INSERT INTO {schema}.effects (job_id, key) VALUES (%s, %s)",
                (ctx.job_id, f"run {len(runs)}"),
            )
        await asyncio.sleep(0)
        if len(runs) == 1:
            raise forklift.Snooze(0.05)
        if len(runs) == 2:
            return forklift.Snooze(0.05)  # type: ignore[return-value]
        return "done"

    job_id = app.enqueue(task(awaiting))
    run_worker()
    done = ended(db, schema, job_id, "succeeded")
    assert (runs, done["attempts"], done["snoozes"], done["result"]) == ([1, 1, 1], 1, 2, "done")
    assert effect_keys(db, schema) == ["run 3"]  # the snoozed runs' effects rolled back


def test_a_snooze_rolls_back_the_effect_and_keeps_the_checkpoint(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    seen: list[Any] = []

    def staged(ctx: forklift.JobContext) -> None:
        seen.append(ctx.checkpointed)
        if len(seen) == 1:
            ctx.checkpoint({"page": 2})
        with ctx.transaction() as conn:
            conn.execute(
                f"INSERT INTO {schema}.effects (job_id, key) VALUES (%s, %s)",
                (ctx.job_id, f"run {len(seen)}"),
            )
        if len(seen) == 1:
            raise forklift.Snooze(0)  # after the block: it is undone all the same

    job_id = app.enqueue(task(staged))
    run_worker()
    done = ended(db, schema, job_id, "succeeded")
    assert seen == [None, {"page": 2}]  # the next run resumed from it
    assert effect_keys(db, schema) == ["run 2"]  # the snoozed run's effect rolled back
    assert (done["attempts"], done["snoozes"], done["checkpoint"]) == (1, 1, None)


def test_a_snoozed_batch_job_does_not_finish_its_batch(
    app: forklift.App, db: Conn, schema: str, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    runs: list[int] = []

    def part(ctx: forklift.JobContext) -> int:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise forklift.Snooze(1.0)
        return 3

    batch = app.enqueue_batch([(task(part), {})], on_complete="assemble")
    (job_id,) = batch.job_ids
    run_worker()
    wait_for(lambda: row(db, schema, job_id)["snoozes"] == 1, what="the snooze recorded")
    status = batch.status()
    if row(db, schema, job_id)["state"] == "ready":  # not claimed again yet
        assert (status.finished, status.pending, status.callback_job_id) == (False, 1, None)
    status = batch.wait(timeout=30)
    assert (status.outcome, status.succeeded) == ("succeeded", 1)
    assert status.callback_job_id is not None
    app.result(status.callback_job_id, timeout=30)
    assert effect_keys(db, schema) == [f"batch-{batch.id}:succeeded:0:"]  # its callback, once


def test_a_snooze_is_fenced_by_owner_and_attempt(
    app: forklift.App, db: Conn, schema: str, store: JobStore
) -> None:
    job_id = app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'w:1:a',"
        " lease_until = now() + interval '30 seconds' WHERE id = %s",
        (job_id,),
    )
    assert job_snooze_many(store, [(job_id, 1, 5.0, 100)], "w:1:other") == []
    assert job_snooze_many(store, [(job_id, 2, 5.0, 100)], "w:1:a") == []
    assert row(db, schema, job_id)["state"] == "running"  # a lost lease snoozes nothing
    at_bound = job_snooze_many(store, [(job_id, 1, 5.0, 0)], "w:1:a")
    assert [tuple(r) for r in at_bound] == [(job_id, False, 0)]
    assert (row(db, schema, job_id)["state"], row(db, schema, job_id)["snoozes"]) == ("running", 0)
    snoozed = job_snooze_many(store, [(job_id, 1, 5.0, 100)], "w:1:a")
    assert [tuple(r) for r in snoozed] == [(job_id, True, 0)]
    after = row(db, schema, job_id)
    assert (after["state"], after["attempts"], after["snoozes"]) == ("ready", 0, 1)
    assert after["available_at"] - after["snoozed_at"] == timedelta(seconds=5)


def test_jobs_show_and_the_dashboard_tell_the_snoozes(
    app: forklift.App,
    db: Conn,
    dsn: str,
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    def twice(ctx: forklift.JobContext) -> None:
        raise forklift.Snooze(3600)

    admin = JobAdmin(dsn, schema)
    plain = app.enqueue("noop")
    job_id = app.enqueue(task(twice))
    run_worker()
    ended(db, schema, plain, "succeeded")
    wait_for(lambda: row(db, schema, job_id)["snoozes"] == 1, what="the snooze recorded")
    detail = admin.job_get(job_id)
    jobview.print_detail(detail)
    shown = capsys.readouterr().out
    assert "\n  attempts     0 of 5\n  crashes      0 of 2\n  snoozes      1, last " in shown
    assert re.search(r"\n  snoozes      1, last \S+ \S+Z \(\S+ ago\)\n", shown), shown
    as_json = jobview.detail_json(detail)
    assert as_json["snoozes"] == 1 and as_json["snoozed_at"].endswith("Z")
    json.dumps(as_json)  # stays JSON
    assert dict(views.job_view(detail).fields)["snoozes"].startswith("1, last ")

    never = admin.job_get(plain)
    jobview.print_detail(never)
    assert "snoozes" not in capsys.readouterr().out  # no line for a job that never snoozed
    assert "snoozes" not in dict(views.job_view(never).fields)
    assert jobview.detail_json(never)["snoozes"] == 0


def test_an_operators_retry_gives_back_the_snoozes(
    app: forklift.App, db: Conn, dsn: str, schema: str, task: Callable[..., str]
) -> None:
    def always(ctx: forklift.JobContext) -> None:
        raise forklift.Snooze(0)

    job_id = app.enqueue(task(always, max_snoozes=1, max_attempts=1))
    assert [r.outcome for r in drain(app).ran] == ["snoozed", "dead"]
    assert row(db, schema, job_id)["snoozes"] == 1
    (acted,) = JobAdmin(dsn, schema).job_retry_many([job_id])
    assert acted.done
    assert (row(db, schema, job_id)["snoozes"], row(db, schema, job_id)["attempts"]) == (0, 0)


def test_drain_runs_a_snoozed_job_again_once_due(
    app: forklift.App, db: Conn, schema: str, task: Callable[..., str]
) -> None:
    runs: list[int] = []

    def later(ctx: forklift.JobContext) -> str:
        runs.append(ctx.attempt)
        if len(runs) == 1:
            raise forklift.Snooze(3600)
        return "ok"

    job_id = app.enqueue(task(later))
    first = drain(app)  # the snoozed job is not due: the drain ends
    assert [(r.outcome, r.attempt, r.error) for r in first.ran] == [("snoozed", 1, None)]
    assert first.snoozed == first.ran and first.counts() == {"snoozed": 1}
    second = drain(app, with_scheduled=True)
    assert [(r.outcome, r.attempt, r.result) for r in second.ran] == [("succeeded", 1, "ok")]
    assert row(db, schema, job_id)["snoozes"] == 1


def test_inline_and_run_job_keep_a_snooze_without_failing(
    app: forklift.App, task: Callable[..., str]
) -> None:
    def returns(ctx: forklift.JobContext) -> forklift.Snooze:
        return forklift.Snooze(30)

    def raises(ctx: forklift.JobContext) -> None:
        raise forklift.Snooze(2.5)

    with inline(app) as jobs:
        for name in (task(returns), task(raises)):
            app.enqueue(name)
    assert [(r.outcome, r.snoozed_for, r.error) for r in jobs.runs] == [
        ("snoozed", 30.0, None),
        ("snoozed", 2.5, None),
    ]
    snoozed = run_job(app.tasks["raises"])
    assert isinstance(snoozed, forklift.Snooze) and snoozed.seconds == 2.5


@pytest.mark.parametrize("bad", [-1, -0.001, float("nan"), float("inf"), "5", None, True])
def test_a_snooze_of_no_sensible_length_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="Snooze seconds must be"):
        forklift.Snooze(bad)


def test_max_snoozes_must_be_a_count(app: forklift.App) -> None:
    for bad in (-1, 1.5, "3", None):
        options: dict[str, Any] = {"max_snoozes": bad}
        with pytest.raises(forklift.ConfigError, match="max_snoozes must be an int >= 0"):
            app.task(name="bad_snoozes", **options)(lambda ctx: None)
    assert "bad_snoozes" not in app.tasks
