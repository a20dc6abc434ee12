"""A fault test's app of resumable jobs (tests/faults/test_resumable.py): each handler
logs what it runs to a file that outlives its process and the database
(FORKLIFT_TEST_RESUMABLE_LOG), so a test counts the loop bodies and steps run again
after a kill. Effects go to the workload's effects table (tests/faults/harness.py: no
unique key, so a second commit shows as a second row). DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

import forklift

app = forklift.App()
SCHEMA = app.schema
LOG_ENV = "FORKLIFT_TEST_RESUMABLE_LOG"

# Short backoffs: a failed attempt (the database restarted under it) runs again at once.
QUICK = forklift.Backoff(base=0.1, factor=2.0, max=1.0, jitter=0.0)


def _log(what: str, key: str, item: int, ctx: forklift.JobContext) -> None:
    # One write of one short line in append mode: lines of several processes never mix.
    line = f"{what} {key} {item} {os.getpid()} {ctx.attempt}\n"
    fd = os.open(os.environ[LOG_ENV], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _effect(conn: psycopg.Connection[Any], key: str, ctx: forklift.JobContext) -> None:
    conn.execute(
        f"INSERT INTO {SCHEMA}.effects (key, job_id, attempt) VALUES (%s, %s, %s)",
        (key, ctx.job_id, ctx.attempt),
    )


@app.task(name="tiles", max_attempts=10, max_crashes=6, backoff=QUICK)
def tiles(ctx: forklift.JobContext, *, key: str, n: int, pause: float, every: float = 0.2) -> int:
    """`n` items of `pause` seconds each, every item's effect (key `key-i`) committed in
    its own effect block; the cursor commits with the effects it stands for, every
    `every` seconds. Logs `start` and `done` of each item's body."""
    ctx.checkpoint_every = every
    for item in ctx.iterate(range(n)):
        _log("start", key, item, ctx)
        time.sleep(pause)
        with ctx.transaction() as conn:
            _effect(conn, f"{key}-{item}", ctx)
        _log("done", key, item, ctx)
    return n


@app.task(name="walk", max_attempts=3, backoff=QUICK)
def walk(ctx: forklift.JobContext, *, key: str, n: int, pause: float) -> int:
    """`n` items of `pause` seconds each, no effect: only the cursor, written by the
    worker's progress thread. Logs `start` and `done` of each item's body."""
    ctx.checkpoint_every = 0.2
    for item in ctx.iterate(range(n)):
        _log("start", key, item, ctx)
        time.sleep(pause)
        _log("done", key, item, ctx)
    return n


@app.task(name="stamp", max_attempts=5, backoff=QUICK)
def stamp(ctx: forklift.JobContext, *, key: str, n: int, first: float, later: float) -> int:
    """Checkpoint {pid, item} at once after each of `n` items (`first` seconds each in
    the first attempt, `later` in the others), resuming after the item checkpointed.
    Logs `begin` and, as it ends, `end:<what ended it>` (`end:ok` when done)."""
    pause = first if ctx.attempt == 1 else later
    saved = ctx.checkpointed
    start = saved["item"] + 1 if isinstance(saved, dict) else 0
    _log("begin", key, start, ctx)
    ended = "ok"
    try:
        for item in range(start, n):
            time.sleep(pause)
            ctx.checkpoint({"pid": os.getpid(), "item": item}, flush=True)
    except BaseException as exc:
        ended = type(exc).__name__
        raise
    finally:
        _log(f"end:{ended}", key, -1, ctx)
    return n


@app.task(name="pipeline", max_attempts=5, max_crashes=3, backoff=QUICK)
def pipeline(ctx: forklift.JobContext, *, key: str, hold: float) -> list[object]:
    """Three steps; the second commits an effect (key `key-stored`), the third runs
    `hold` seconds in the first attempt (a test kills the worker there). Each step
    logs `step:<name>` as it starts."""
    fetched = ctx.step("fetch", _fetch, ctx, key)
    stored = ctx.step("store", _store, ctx, key)
    published = ctx.step("publish", _publish, ctx, key, hold)
    return [fetched, stored, published]


def _fetch(ctx: forklift.JobContext, key: str) -> str:
    _log("step:fetch", key, 1, ctx)
    return f"{key}-fetched"


def _store(ctx: forklift.JobContext, key: str) -> int:
    _log("step:store", key, 2, ctx)
    with ctx.transaction() as conn:
        _effect(conn, f"{key}-stored", ctx)
    return 2


def _publish(ctx: forklift.JobContext, key: str, hold: float) -> int:
    _log("step:publish", key, 3, ctx)
    if ctx.attempt == 1:
        time.sleep(hold)
    return 3


@dataclass(frozen=True)
class Line:
    """One line of the log: what ran, of which job key, which item, in which process and
    attempt."""

    what: str
    key: str
    item: int
    pid: int
    attempt: int


def lines(log: Path) -> list[Line]:
    """Every line logged so far, in order."""
    if not log.exists():
        return []
    found = []
    for text in log.read_text().splitlines():
        what, key, item, pid, attempt = text.split()
        found.append(Line(what, key, int(item), int(pid), int(attempt)))
    return found
