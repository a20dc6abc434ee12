"""`forklift batches list|show|cancel` and what `jobs show` says of a result and a progress,
through the real CLI against a real schema: batches made by App.enqueue_batch, their
jobs' states set in SQL (no supervisor), hostile names and values shown escaped."""

from __future__ import annotations

import json
from typing import Any

import psycopg

import forklift
from forklift import _display
from forklift.batch import Batch
from tests.acceptance.conftest import cli, cli_json
from tests.acceptance.test_operator_cli import JOB_KEYS, SHOW_KEYS, documented

BATCH_KEYS = {
    "id", "state", "outcome", "total", "ready", "running", "succeeded", "dead", "cancelled",
    "pending", "done", "percent", "rate_per_second", "eta_seconds", "age_seconds",
    "created_at", "sealed_at", "cancelled_at", "finished_at", "abandoned_at", "cancelled_by",
    "callback_task", "callback_job_id", "callback_state",
}  # fmt: skip
BATCH_SHOW_KEYS = BATCH_KEYS | {
    "running_progress_done", "running_progress_total", "last_ended_at", "callback",
    "callback_job", "dead_jobs",
}  # fmt: skip
CANCEL_KEYS = {
    "id", "result", "cancelled_ready", "cancelled_running", "not_cancelled", "state",
    "outcome", "cancelled_by", "callback_job_id",
}  # fmt: skip
PROGRESS_KEYS = {"done", "total", "message", "at"}

# An HTML tag (harmless on a terminal, shown as it is; the dashboard escapes it), an SGR
# and a clear-screen, an OSC that renames the terminal, and a right-to-left override.
HOSTILE = "<script>alert(1)</script>\x1b[31m\x1b[2J\x1b]2;PWNED\x07\u202eevil"
ESCAPED = "<script>alert(1)</script>\\x1b[31m\\x1b[2J\\x1b]2;PWNED\\x07\\u202eevil"
# The same inside a JSON text that `jobs show` prints (a result): C0 as JSON writes it.
ESCAPED_JSON = "<script>alert(1)</script>\\u001b[31m\\u001b[2J\\u001b]2;PWNED\\u0007\\u202eevil"


def clean(text: str) -> None:
    """Nothing in `text` that a terminal would act on, or that reorders what it shows."""
    assert not [ch for ch in text.replace("\n", "") if _display.unsafe(ch)], text


def set_jobs(db: psycopg.Connection[Any], schema: str, ids: list[int], sets: str, *p: Any) -> None:
    db.execute(f"UPDATE {schema}.jobs SET {sets} WHERE id = ANY(%s)", (*p, ids))


def make_batches(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> tuple[Batch, Batch]:
    """An open batch of 6 (2 succeeded, 1 dead, 2 running with progress, 1 ready) whose
    callback's task has a hostile name, and a finished batch of 2 with its callback."""
    open_ = app.enqueue_batch(
        [("square", {"n": n}) for n in range(6)],
        on_complete="assemble",
        on_complete_args={"out": "m.png", "api_key": "sekret-1"},
    )
    ids = open_.job_ids
    set_jobs(db, schema, ids[:2], "state = 'succeeded', completed_at = now(), result = '4'")
    set_jobs(db, schema, ids[2:3], "state = 'dead', completed_at = now(), last_error = %s", HOSTILE)
    set_jobs(
        db, schema, ids[3:5],
        "state = 'running', attempts = 1, started_at = now(), lease_owner = 'h:1:w',"
        " lease_until = now() + interval '1 hour',"
        " progress = jsonb_build_object('done', 30, 'total', 120, 'message', %s::text,"
        " 'at', now())",
        HOSTILE,
    )  # fmt: skip
    db.execute(
        f"UPDATE {schema}.batches"
        " SET callback = jsonb_set(callback, '{task}', to_jsonb(%s::text)) WHERE id = %s",
        (f"asm{HOSTILE}", open_.id),
    )
    finished = app.enqueue_batch(
        [("square", {"n": 1}), ("square", {"n": 2})], on_complete="assemble"
    )
    set_jobs(db, schema, finished.job_ids, "state = 'succeeded', completed_at = now()")
    assert set(app.batches.finish_if_done({finished.id})) == {finished.id}
    return open_, finished


def test_batches_list_show_and_cancel(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    app = forklift.App(dsn, schema=schema)
    open_, finished = make_batches(app, db, schema)
    check_list(env, open_, finished)
    check_show(env, open_, finished)
    check_cancel(env, db, schema, open_, finished)
    app.close()


def check_list(env: dict[str, str], open_: Batch, finished: Batch) -> None:
    listed = cli_json(env, "batches", "list")
    assert [b["id"] for b in listed["open"]] == [open_.id]
    assert [b["id"] for b in listed["finished"]] == [finished.id]
    first, done = listed["open"][0], listed["finished"][0]
    assert set(first) == BATCH_KEYS and set(done) == BATCH_KEYS
    documented(BATCH_KEYS | {"open", "finished"}, "batches", "list")
    assert (first["state"], first["total"], first["pending"], first["done"]) == ("open", 6, 3, 3)
    counts = [first[k] for k in ("ready", "running", "succeeded", "dead", "cancelled")]
    assert counts == [1, 2, 2, 1, 0] and first["percent"] == 50.0
    assert first["rate_per_second"] > 0 and first["eta_seconds"] is not None
    assert first["callback_task"] == f"asm{HOSTILE}" and first["callback_job_id"] is None
    assert (done["state"], done["outcome"], done["callback_state"]) == (
        "finished", "succeeded", "ready",
    )  # fmt: skip
    assert done["eta_seconds"] is None and done["percent"] == 100.0

    table = cli(env, "batches", "list")
    assert table.returncode == 0, table.stderr
    clean(table.stdout)
    lines = table.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "state", "total", "ready"] and len(lines) == 3
    assert lines[1].split()[:9] == [str(open_.id), "open", "6", "1", "2", "2", "1", "0", "50%"]
    assert "asm<script>alert(1)</script>\\x1b[31m" in lines[1]
    assert lines[2].split()[:2] == [str(finished.id), "finished"]
    assert f"assemble #{done['callback_job_id']} ready" in lines[2]


def check_show(env: dict[str, str], open_: Batch, finished: Batch) -> None:
    shown = cli_json(env, "batches", "show", str(open_.id))
    assert set(shown) == BATCH_SHOW_KEYS
    documented(BATCH_SHOW_KEYS, "batches", "show")
    assert (shown["running_progress_done"], shown["running_progress_total"]) == (60, 240)
    assert shown["callback"]["task"] == f"asm{HOSTILE}"
    assert json.loads(shown["callback"]["args"]) == {"out": "m.png", "api_key": "***"}
    assert shown["dead_jobs"] == [{"id": open_.job_ids[2], "last_error": HOSTILE}]
    assert shown["callback_job"] is None
    text = cli(env, "batches", "show", str(open_.id)).stdout
    clean(text)
    assert "sekret" not in text and '"api_key": "***"' in text
    assert f"batch {open_.id}: open" in text and "  done         3/6 (50%)" in text
    assert "60/240 (25%): the progress its 2 running jobs report" in text
    assert f"  callback     asm{ESCAPED} in queue default" in text
    assert f"  job {open_.job_ids[2]}: {ESCAPED}" in text
    after = cli_json(env, "batches", "show", str(finished.id))
    assert set(after["callback_job"]) == JOB_KEYS and after["callback_job"]["task"] == "assemble"


def check_cancel(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, open_: Batch, finished: Batch
) -> None:
    cancelled = cli_json(env, "batches", "cancel", str(open_.id))
    assert set(cancelled) == CANCEL_KEYS
    documented(CANCEL_KEYS, "batches", "cancel")
    assert cancelled["result"] == "cancelled" and cancelled["cancelled_by"]
    assert (cancelled["cancelled_ready"], cancelled["cancelled_running"]) == (1, 2)
    assert (cancelled["state"], cancelled["outcome"]) == ("finished", "cancelled")
    states = db.execute(
        f"SELECT state::text, count(*) FROM {schema}.jobs WHERE batch_id = %s GROUP BY 1"
        " ORDER BY 1",
        (open_.id,),
    ).fetchall()
    assert states == [("cancelled", 3), ("dead", 1), ("succeeded", 2)]
    callback = db.execute(
        f"SELECT task FROM {schema}.jobs WHERE id = %s", (cancelled["callback_job_id"],)
    ).fetchone()
    assert callback == (f"asm{HOSTILE}",)  # enqueued once, by the finish the cancel made

    again = cli(env, "batches", "cancel", str(open_.id))
    assert again.returncode == 1
    assert again.stdout.startswith(f"batch {open_.id}: not cancelled: it finished already")
    refused = cli_json(env, "batches", "cancel", str(finished.id), code=1)
    assert (refused["result"], refused["outcome"]) == ("finished", "succeeded")
    for command in ("show", "cancel"):
        missing = cli(env, "batches", command, "424242")
        assert missing.returncode == 1 and missing.stdout == ""
        assert missing.stderr.strip() == f"forklift: error: no batch 424242 in schema {schema}"


def test_jobs_show_says_a_jobs_result_progress_and_batch(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    app = forklift.App(dsn, schema=schema)
    batch = app.enqueue_batch([("square", {"n": 1}), ("report", {"steps": 9})])
    done, running = batch.job_ids
    result = {"ok": True, "password": "hunter2", "note": HOSTILE, "nested": [{"Token": "t"}]}
    set_jobs(
        db, schema, [done], "state = 'succeeded', completed_at = now(), result = %s::jsonb",
        json.dumps(result),
    )  # fmt: skip
    db.execute(f"UPDATE {schema}.jobs SET task = %s WHERE id = %s", (f"sq{HOSTILE}", done))
    set_jobs(
        db, schema, [running],
        "state = 'running', attempts = 1, started_at = now(), lease_owner = 'h:1:w',"
        " progress = jsonb_build_object('done', 12, 'total', 300, 'message', %s::text,"
        " 'at', now())",
        HOSTILE,
    )  # fmt: skip

    shown = cli_json(env, "jobs", "show", str(done))
    assert set(shown) == SHOW_KEYS and shown["batch_id"] == batch.id
    assert shown["result"] == {**result, "password": "***", "nested": [{"Token": "***"}]}
    assert shown["progress"] is None and shown["task"] == f"sq{HOSTILE}"
    text = cli(env, "jobs", "show", str(done)).stdout
    clean(text)
    assert "hunter2" not in text and '"password": "***"' in text
    assert text.startswith(f"job {done}: sq{ESCAPED} in queue default, succeeded")
    [line] = [line for line in text.splitlines() if line.startswith("  result ")]
    assert ESCAPED_JSON in line and f"  batch        {batch.id}" in text

    progress = cli_json(env, "jobs", "show", str(running))
    assert set(progress["progress"]) == PROGRESS_KEYS and progress["result"] is None
    assert (progress["progress"]["done"], progress["progress"]["total"]) == (12, 300)
    assert progress["progress"]["message"] == HOSTILE and progress["progress"]["at"]
    text = cli(env, "jobs", "show", str(running)).stdout
    clean(text)
    assert f"  progress     12/300 (4%): {ESCAPED} (reported " in text

    big = {"blob": "x" * 5000}
    set_jobs(db, schema, [done], "result = %s::jsonb", json.dumps(big))
    assert cli_json(env, "jobs", "show", str(done))["result"] == big  # whole in --json
    text = cli(env, "jobs", "show", str(done)).stdout
    [line] = [line for line in text.splitlines() if line.startswith("  result ")]
    assert line.endswith("… (truncated)") and len(line) < 2100
    app.close()


def test_batches_cancel_finishes_a_batch_its_producer_left_filling(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """A producer died inside `with app.batch()`, its jobs all ended: `batches cancel`
    seals and finishes the batch now, its callback enqueued once."""
    app = forklift.App(dsn, schema=schema)
    left = app.batch(on_complete="assemble").__enter__()
    ids = left.enqueue_many([("square", {"n": n}) for n in range(2)])
    set_jobs(db, schema, ids, "state = 'succeeded', completed_at = now()")
    assert cli_json(env, "batches", "show", str(left.id))["state"] == "filling"
    text = cli(env, "batches", "cancel", str(left.id)).stdout
    assert "0 ready and 0 running jobs cancelled; it finished (cancelled)" in text, text
    shown = cli_json(env, "batches", "show", str(left.id))
    assert (shown["state"], shown["outcome"], shown["succeeded"]) == ("finished", "cancelled", 2)
    assert shown["sealed_at"] is not None and shown["callback_job_id"] is not None
    app.close()


PRODUCER_DIES_IN_ITS_BLOCK = """
import os, sys
from tests.apps.basic import app
with app.batch(on_complete="assemble") as b:
    b.enqueue_many([("square", {"n": 3})] * 2)
    print(b.id, flush=True)
    os.kill(os.getpid(), 9)
"""


def test_forklift_run_finishes_a_batch_whose_producer_was_killed_in_its_block(
    env: dict[str, str], schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """A producer SIGKILLed inside `with app.batch()`: `forklift run
    --batch-abandon-after 1s` seals the batch as abandoned once its jobs ran, and its
    callback runs once, seeing the outcome 'abandoned'."""
    import subprocess
    import sys

    from forklift.testing import wait_for

    producer = subprocess.run(
        [sys.executable, "-c", PRODUCER_DIES_IN_ITS_BLOCK],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert producer.returncode == -9, producer.stderr
    batch_id = int(producer.stdout.split()[0])
    sup = forklift_cli(
        "run", "tests.apps.basic:app", "--workers", "1", "--batch-abandon-after", "1s"
    )

    def shown() -> dict[str, Any]:
        found: dict[str, Any] = cli_json(env, "batches", "show", str(batch_id))
        return found

    wait_for(lambda: shown()["state"] == "finished", timeout=30, what="the batch finished")
    after = shown()
    assert (after["outcome"], after["succeeded"], after["abandoned_at"] is not None) == (
        "abandoned", 2, True,
    )  # fmt: skip
    wait_for(
        lambda: (shown()["callback_job"] or {}).get("state") == "succeeded",
        timeout=30, what="the callback ran",
    )  # fmt: skip
    effects = db.execute(f"SELECT key FROM {schema}.effects").fetchall()
    assert effects == [(f"batch-{batch_id}:abandoned:0:",)]
    assert "batch.abandoned" in sup.output()
    sup.stop_cleanly()
