"""Resumable jobs in one worker: checkpoints, ctx.iterate and ctx.step across attempts,
fenced by owner and attempt (workers/checkpoints.py). The kills are in
tests/faults/test_resumable.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import psycopg

import forklift
from forklift.store import JobStore, job_checkpoint, job_checkpoint_many
from forklift.testing import wait_for
from tests.integration.conftest import RunWorker, tallied

OWNER = "test-host:1:checkpoints"


def row(db: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any]:
    found = db.execute(
        f"SELECT state::text, attempts, checkpoint, checkpoint_at FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return dict(zip(("state", "attempts", "checkpoint", "at"), found, strict=True))


def effects(db: psycopg.Connection[Any], schema: str) -> list[str]:
    return [r[0] for r in db.execute(f"SELECT key FROM {schema}.effects ORDER BY n, key")]


def insert(conn: psycopg.Connection[Any], schema: str, key: str, n: int = 0) -> None:
    conn.execute(f"INSERT INTO {schema}.effects (key, n) VALUES (%s, %s)", (key, n))


def finished(db: psycopg.Connection[Any], schema: str, job_id: int, state: str) -> dict[str, Any]:
    wait_for(lambda: row(db, schema, job_id)["state"] == state, what=f"job {state}")
    return row(db, schema, job_id)


def test_a_checkpoint_reaches_the_next_attempt_and_success_clears_it(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    seen: list[Any] = []

    def phases(ctx: forklift.JobContext) -> None:
        seen.append(ctx.checkpointed)
        if ctx.attempt == 1:
            ctx.checkpoint({"phase": 2})
            raise RuntimeError("first attempt fails after its checkpoint")

    job_id = app.enqueue(task(phases))
    run_worker()
    done = finished(db, schema, job_id, "succeeded")
    assert seen == [None, {"phase": 2}]
    assert done["checkpoint"] is None and done["at"] is None  # nothing left to resume


def test_iterate_resumes_after_the_last_item_whose_body_finished(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    bodies: list[tuple[int, int]] = []

    def tiles(ctx: forklift.JobContext) -> None:
        for tile in ctx.iterate(range(10)):
            if ctx.attempt == 1 and tile == 6:
                raise RuntimeError("crash in tile 6")
            bodies.append((ctx.attempt, tile))

    job_id = app.enqueue(task(tiles))
    run_worker()
    finished(db, schema, job_id, "succeeded")
    assert bodies == [(1, t) for t in range(6)] + [(2, t) for t in range(6, 10)]


def test_iterate_commits_each_cursor_with_the_rows_it_stands_for(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def rows(ctx: forklift.JobContext) -> None:
        ctx.checkpoint_every = 0.0  # commit at every item boundary
        for n in ctx.iterate(range(8)):
            with ctx.transaction() as conn:
                insert(conn, schema, f"row-{n}", n)
            if ctx.attempt == 1 and n == 4:
                raise RuntimeError("crash after row 4's block, before its boundary")

    job_id = app.enqueue(task(rows))
    run_worker()
    finished(db, schema, job_id, "succeeded")
    # Row 4's block never reached a commit point: it rolled back with the failure and
    # ran again; every row committed exactly once.
    assert effects(db, schema) == [f"row-{n}" for n in range(8)]


def test_keyset_pages_resume_from_the_cursor_of_the_last_item(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    data = [{"id": i} for i in range(1, 26)]
    asked: list[Any] = []

    def fetch(after: Any) -> list[dict[str, int]]:
        asked.append(after)
        start = 0 if after is None else after
        return [r for r in data if r["id"] > start][:10]

    def pages(ctx: forklift.JobContext) -> int:
        total = 0
        for item in ctx.iterate(fetch, cursor=lambda r: r["id"]):
            if ctx.attempt == 1 and item["id"] == 15:
                raise RuntimeError("crash at 15")  # its cursor (14) goes with the failure
            total += item["id"]
        return total

    job_id = app.enqueue(task(pages))
    run_worker()
    finished(db, schema, job_id, "succeeded")
    assert asked == [None, 10, 14, 24, 25]  # attempt 2 asked for the page after 14


def test_a_step_runs_once_across_attempts_and_its_effect_commits_once(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    calls: list[str] = []

    def download(ctx: forklift.JobContext) -> dict[str, str]:
        calls.append("download")
        with ctx.transaction() as conn:
            insert(conn, schema, "downloaded")
        return {"path": "/tmp/x"}

    def upload(path: str) -> str:
        calls.append("upload")
        return f"uploaded {path}"

    def pipeline(ctx: forklift.JobContext) -> str:
        got = ctx.step("download", download, ctx)
        if ctx.attempt == 1:
            raise RuntimeError("the transform crashed")
        return str(ctx.step("upload", upload, got["path"]))

    job_id = app.enqueue(task(pipeline))
    run_worker()
    finished(db, schema, job_id, "succeeded")
    assert calls == ["download", "upload"]
    assert effects(db, schema) == ["downloaded"]
    assert app.result(job_id, timeout=5) == "uploaded /tmp/x"


def test_a_graceful_stop_ends_the_loop_checkpointed_and_spends_no_attempt(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    reached = threading.Event()
    bodies: list[tuple[int, int]] = []

    def long(ctx: forklift.JobContext) -> None:
        for n in ctx.iterate(range(1_000_000)):
            bodies.append((ctx.attempt, n))
            if n == 100:
                reached.set()
            if n >= 100:
                ctx.wait_cancelled(0.01)  # a slow item: the stop comes while it runs

    job_id = app.enqueue(task(long), max_attempts=1)
    worker = run_worker(grace=30.0)
    assert reached.wait(10)
    worker.request_stop()
    stopped = finished(db, schema, job_id, "ready")
    assert stopped["attempts"] == 0  # given back uncounted: its one attempt is still to come
    cursor = stopped["checkpoint"]["cursors"]["iterate"]
    assert cursor == bodies[-1][1]  # the last item whose body finished: nothing lost


def test_interrupted_raised_while_not_stopping_is_a_failed_attempt(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def liar(ctx: forklift.JobContext) -> None:
        raise forklift.Interrupted("not really stopping")

    job_id = app.enqueue(task(liar), max_attempts=2)
    run_worker()
    dead = finished(db, schema, job_id, "dead")
    assert dead["attempts"] == 2


def test_a_checkpoint_is_fenced_by_owner_and_attempt_and_never_goes_back(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, store: JobStore
) -> None:
    job_id = app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = %s, "
        "lease_until = now() + interval '1 minute' WHERE id = %s",
        (OWNER, job_id),
    )

    def doc(v: int) -> str:
        return json.dumps({"v": v, "state": v})

    assert job_checkpoint_many(store, [(job_id, 1, doc(2))], OWNER) == {job_id}
    assert job_checkpoint_many(store, [(job_id, 1, doc(3))], "someone-else") == set()
    assert job_checkpoint_many(store, [(job_id, 2, doc(3))], OWNER) == set()
    assert job_checkpoint_many(store, [(job_id, 1, doc(1))], OWNER) == {job_id}  # older
    found, age = job_checkpoint(store, job_id)
    assert found == {"v": 2, "state": 2}
    assert 0 <= age < 60


def test_a_checkpoint_that_is_not_json_or_too_big_is_refused_in_the_handler(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    errors: list[str] = []

    def bad(ctx: forklift.JobContext) -> None:
        for state in ({"when": object()}, "x" * (app.max_result_bytes + 1)):
            try:
                ctx.checkpoint(state)
            except forklift.ResultError as exc:
                errors.append(str(exc))

    job_id = app.enqueue(task(bad))
    run_worker()
    finished(db, schema, job_id, "succeeded")
    assert len(errors) == 2
    assert all("a checkpoint" in e for e in errors)


def test_a_resumed_attempt_is_counted_with_the_work_its_checkpoint_stood_for(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, task: Callable[..., str]
) -> None:
    def resumes(ctx: forklift.JobContext) -> None:
        if ctx.checkpointed is None:
            ctx.checkpoint("halfway", flush=True)
            raise RuntimeError("first attempt")

    job_id = app.enqueue(task(resumes))
    deltas = tallied(app, lambda: finished(db, schema, job_id, "succeeded"))
    assert [r[:3] for r in deltas["resumes"]] == [["default", "resumes", 1]]
    assert deltas["resumes"][0][3] >= 0


def test_an_async_handler_resumes_its_steps_and_its_loop_with_effects_once(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    calls: list[str] = []
    bodies: list[tuple[int, int]] = []

    async def fetched() -> str:
        calls.append("fetch")
        return "data"

    async def pipeline(ctx: forklift.AsyncJobContext) -> None:
        assert await ctx.step("fetch", fetched) == "data"
        ctx.checkpoint_every = 0.0  # commit at every item boundary
        async for n in ctx.iterate(range(6)):
            bodies.append((ctx.attempt, n))
            async with ctx.transaction() as conn:
                await conn.execute(
                    f"INSERT INTO {schema}.effects (key, n) VALUES (%s, %s)", (f"row-{n}", n)
                )
            if ctx.attempt == 1 and n == 3:
                raise RuntimeError("crash after row 3's block, before its boundary")

    job_id = app.enqueue(task(pipeline))
    run_worker()
    finished(db, schema, job_id, "succeeded")
    assert calls == ["fetch"]
    assert effects(db, schema) == [f"row-{n}" for n in range(6)]
    # Rows 0-2 committed with their cursors at their items' ends; row 3's did not.
    assert bodies == [(1, n) for n in range(4)] + [(2, n) for n in range(3, 6)]
