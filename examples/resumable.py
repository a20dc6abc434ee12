"""A resumable CPU job: killed three times, it loses about a second of work each time.

`longest_chain` looks for the number below --items x 5,000 with the longest Collatz
chain, one block of 5,000 numbers per work item, in pure Python (~50 ms an item). It
loops with `for block in ctx.iterate(range(items))`: the index of the last block done
is checkpointed about every second, so an attempt that follows a crash starts after it
instead of at block 0. Each block's answer is stored by block (an upsert that also
counts how many times the block was computed), so a block done twice is stored once,
and counted twice.

`python -m examples.resumable` shows it: it starts `forklift run examples.resumable:app
--workers 1`, enqueues one job, SIGKILLs the worker running it three times mid-job
(each time the attempt has done 40 blocks), lets it finish, and prints the blocks
computed twice and their seconds against the bound, 3 x (the checkpoint interval + one
block). Everything lives in the app's schema (FORKLIFT_SCHEMA). With no
FORKLIFT_DATABASE_URL, forklift uses the project's development database under
./.forklift (the `embedded` extra). From the repository root:

    export FORKLIFT_DATABASE_URL=postgresql://localhost/mydb FORKLIFT_SCHEMA=resumable
    .venv/bin/python -m examples.resumable
"""

from __future__ import annotations

import argparse
import functools
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psycopg

import forklift
from forklift.testing import ForkliftProcess, wait_for

app = forklift.App()

BLOCK = 5_000  # numbers per work item
CHECKPOINT_EVERY = 1.0  # seconds between checkpoints written (forklift's default)
ITEMS_BEFORE_KILL = 40  # blocks an attempt computes before the example kills its worker

TABLE = """
CREATE TABLE IF NOT EXISTS "{schema}".collatz_blocks (
    job_id  bigint NOT NULL,
    block   integer NOT NULL,
    n       integer NOT NULL,
    steps   integer NOT NULL,
    runs    integer NOT NULL DEFAULT 1,
    seconds double precision NOT NULL,
    attempt integer NOT NULL,
    PRIMARY KEY (job_id, block)
)
"""
STORE = """
INSERT INTO "{schema}".collatz_blocks (job_id, block, n, steps, seconds, attempt)
VALUES (%s, %s, %s, %s, %s, %s)
ON CONFLICT (job_id, block) DO UPDATE SET runs = collatz_blocks.runs + 1,
    seconds = collatz_blocks.seconds + excluded.seconds, attempt = excluded.attempt
"""
BEST = """
SELECT n, steps FROM "{schema}".collatz_blocks WHERE job_id = %s
ORDER BY steps DESC, n LIMIT 1
"""
# Blocks computed more than once, the seconds of those extra runs (at the average
# block's), the average block's seconds.
REDONE = """
SELECT sum(runs - 1), sum(runs - 1) * sum(seconds) / sum(runs), sum(seconds) / sum(runs)
FROM "{schema}".collatz_blocks WHERE job_id = %s
"""


def longest_in(start: int, stop: int) -> tuple[int, int]:
    """(steps, n) of the n in [start, stop) with the longest Collatz chain."""
    best = (0, 0)
    for n in range(max(start, 1), stop):
        steps, x = 0, n
        while x != 1:
            x = x // 2 if x % 2 == 0 else 3 * x + 1
            steps += 1
        best = max(best, (steps, n))
    return best


@app.task(max_attempts=10, max_crashes=5, backoff=forklift.Backoff(base=0.2, jitter=0.0))
def longest_chain(ctx: forklift.JobContext, *, items: int) -> dict[str, int]:
    """The n below items x BLOCK with the longest Collatz chain, resumable: a crash (a
    kill counts as one; max_crashes lets the job survive the example's three) costs the
    blocks done since the last checkpoint, not the whole job."""
    ctx.checkpoint_every = CHECKPOINT_EVERY
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        for block in ctx.iterate(range(items)):
            started = time.perf_counter()
            steps, n = longest_in(block * BLOCK, (block + 1) * BLOCK)
            seconds = time.perf_counter() - started
            row = (ctx.job_id, block, n, steps, seconds, ctx.attempt)
            conn.execute(STORE.format(schema=app.schema), row)
        best = conn.execute(BEST.format(schema=app.schema), (ctx.job_id,)).fetchone()
    assert best is not None
    return {"n": best[0], "steps": best[1]}


# -- the demonstration: a supervisor, three kills, the numbers -----------------------------


def query(sql: str, *params: Any) -> tuple[Any, ...]:
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        row = conn.execute(sql.format(schema=app.schema), params).fetchone()
    assert row is not None
    return tuple(row)


def worker_running(supervisor: ForkliftProcess, job_id: int, attempt: int) -> int | None:
    """The pid of the supervisor's worker running the job's `attempt`, once that attempt
    has computed ITEMS_BEFORE_KILL blocks (None until then)."""
    supervisor.check_alive()
    state, attempts, owner = query(
        'SELECT state::text, attempts, lease_owner FROM "{schema}".jobs WHERE id = %s', job_id
    )
    if state != "running" or attempts != attempt:
        return None
    (done,) = query(
        'SELECT count(*) FROM "{schema}".collatz_blocks WHERE job_id = %s AND attempt = %s',
        job_id,
        attempt,
    )
    pid = int(owner.split(":")[1])  # a lease owner is host:pid:...
    return pid if done >= ITEMS_BEFORE_KILL and pid in supervisor.children() else None


def kill_and_finish(supervisor: ForkliftProcess, job_id: int, kills: int) -> str:
    """SIGKILL the worker running the job `kills` times, mid-job; wait until the job has
    ended; its state."""
    for attempt in range(1, kills + 1):
        running = functools.partial(worker_running, supervisor, job_id, attempt)
        pid = wait_for(running, 60, what=f"attempt {attempt} mid-way")
        os.kill(pid, signal.SIGKILL)
        print(f"kill {attempt}: SIGKILL of worker {pid}, which was running attempt {attempt}")

    def ended() -> str | None:
        supervisor.check_alive()
        (state,) = query('SELECT state::text FROM "{schema}".jobs WHERE id = %s', job_id)
        return None if state in ("ready", "running") else str(state)

    state: str = wait_for(ended, 120, what="the job to end")
    return state


def report(job_id: int, items: int, kills: int) -> None:
    attempts, result = query('SELECT attempts, result FROM "{schema}".jobs WHERE id = %s', job_id)
    redone, seconds, per_item = query(REDONE, job_id)
    bound = kills * (CHECKPOINT_EVERY + per_item)
    print(f"job {job_id}: succeeded after {attempts} attempts")
    print(f"answer: {result['n']:,} ({result['steps']} steps) below {items * BLOCK:,}")
    print(f"items: {items}, {per_item * 1000:.0f} ms each")
    print(f"kills: {kills}")
    print(f"items redone: {redone}")
    verdict = "within the bound" if seconds <= bound else "OVER the bound"
    print(
        f"work redone: {seconds:.2f} s; bound: {kills} x ({CHECKPOINT_EVERY:g} s checkpoint "
        f"interval + one item) = {bound:.2f} s; {verdict}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m examples.resumable", description=__doc__)
    parser.add_argument("--items", type=int, default=200, help="blocks of 5,000 numbers")
    parser.add_argument("--kills", type=int, default=3, help="SIGKILLs of the worker")
    args = parser.parse_args(argv)
    app.migrate()
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(TABLE.format(schema=app.schema))
    env = dict(os.environ, FORKLIFT_DATABASE_URL=app.dsn, FORKLIFT_SCHEMA=app.schema)
    with tempfile.TemporaryDirectory() as tmp:
        supervisor = ForkliftProcess(
            ["run", "examples.resumable:app", "--workers", "1", "--metrics-addr", "off"],
            env,
            Path(tmp) / "forklift.log",
        )
        try:
            job_id = longest_chain.enqueue(items=args.items)
            print(f"job {job_id}: {args.items} blocks, supervisor pid {supervisor.pid}")
            state = kill_and_finish(supervisor, job_id, args.kills)
        finally:
            supervisor.stop()
        if state != "succeeded":
            print(f"job {job_id} ended {state}:\n{supervisor.output()[-3000:]}")
            return 1
    report(job_id, args.items, args.kills)
    return 0


if __name__ == "__main__":
    sys.exit(main())
