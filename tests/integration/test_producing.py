"""Producing: what every way to enqueue writes, and what a producer loads."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.scheduler.service import Scheduler
from forklift.scheduler.store import ScheduleStore

Conn = psycopg.Connection[Any]

# What a job's row takes from its task and its arguments, whichever way it was enqueued.
COLUMNS = "queue, task, args, priority, max_attempts, max_crashes, timeout, limit_key"

# A producer's whole life: declare tasks and a schedule, enqueue every way, make batches.
PRODUCER = """
import asyncio, json, sys
import forklift

app = forklift.App()

@app.task
def add(ctx, *, a: int) -> int:
    return a

@app.periodic(every=60, name="tick")
def tick(ctx) -> None: ...

add.enqueue(a=1)
app.enqueue_many([("add", {"a": 2}), forklift.JobSpec("add", {"a": 3}, delay=60)])
app.enqueue_batch([("add", {"a": 4})], on_complete="add", on_complete_args={"a": 5})
with app.batch() as writer:
    writer.enqueue(add, a=6)
asyncio.run(app.enqueue_async("add", {"a": 7}))
app.close()
print(json.dumps(sorted(sys.modules)))
"""


def test_a_producer_loads_no_worker_module(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    assert "forklift.app" in loaded
    assert [m for m in loaded if m.startswith(("forklift.workers", "forklift.supervisor"))] == []


@pytest.fixture
def charging(dsn: str, schema: str) -> Iterator[forklift.App]:
    """An app whose one task sets every option a job takes from its task."""
    app = forklift.App(dsn, schema=schema)

    @app.task(
        queue="money", priority=7, max_attempts=3, max_crashes=4, timeout=9.5,
        limit=forklift.Limit(concurrency=2, key="account"),
    )  # fmt: skip
    def charge(ctx: forklift.JobContext, *, account: str, cents: int = 0) -> None:
        pass

    yield app
    app.close()


def test_every_way_to_enqueue_writes_the_same_row(
    charging: forklift.App, dsn: str, schema: str, db: Conn
) -> None:
    """enqueue (forklift's connection and the caller's), enqueue_many (COPY and INSERT),
    enqueue_async (both), a batch's job and its callback, and a schedule's fire: one job
    of one task with one set of arguments is one row, whichever wrote it."""
    app, args = charging, {"account": "a", "cents": 5}
    ways: dict[str, Callable[[], int]] = {
        "enqueue": lambda: app.enqueue("charge", args),
        "enqueue(conn)": lambda: app.enqueue("charge", args, conn=db),
        "enqueue_many (COPY)": lambda: app.enqueue_many([("charge", args)])[0],
        "enqueue_many (INSERT)": lambda: app.enqueue_many(
            [forklift.JobSpec("charge", args, idempotency_key="many")]
        )[0],
        "enqueue_async": lambda: asyncio.run(app.enqueue_async("charge", args)),
        "enqueue_async(conn)": lambda: asyncio.run(enqueue_async_in(app, dsn, args)),
        "batch job": lambda: app.enqueue_batch([("charge", args)]).job_ids[0],
        "batch callback": lambda: callback_of_empty_batch(app, args),
        "schedule fire": lambda: fire_once(app, dsn, schema, args),
    }
    rows: dict[str, tuple[Any, ...] | None] = {}
    for way, enqueue in ways.items():
        job_id = enqueue()
        rows[way] = db.execute(
            f"SELECT {COLUMNS} FROM {schema}.jobs WHERE id = %s", [job_id]
        ).fetchone()
    first = rows["enqueue"]
    assert first == ("money", "charge", args, 7, 3, 4, 9.5, "a")
    assert {way: row for way, row in rows.items() if row != first} == {}


async def enqueue_async_in(app: forklift.App, dsn: str, args: dict[str, Any]) -> int:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        return await app.enqueue_async("charge", args, conn=conn)


def callback_of_empty_batch(app: forklift.App, args: dict[str, Any]) -> int:
    """The callback's job of a batch with no jobs, which finishes as it is made."""
    status = app.enqueue_batch([], on_complete="charge", on_complete_args=args).status()
    assert status.finished and status.callback_job_id is not None
    return status.callback_job_id


def fire_once(app: forklift.App, dsn: str, schema: str, args: dict[str, Any]) -> int:
    """The job of a schedule's one fire, at the last whole minute."""
    schedule = app.periodic(task="charge", every=60, name="charging", args=args)
    scheduler = Scheduler(ScheduleStore(dsn, schema, _db.Timeouts()), [schedule])
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    fires = [
        *scheduler.run_once(now - timedelta(seconds=1)).fires,  # defines it (may fire ahead)
        *scheduler.run_once(now + timedelta(seconds=1)).fires,
    ]
    ids = [f.job_id for f in fires if f.job_id is not None]
    assert len(ids) == 1, fires
    return ids[0]
