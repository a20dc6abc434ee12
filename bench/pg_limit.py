"""PostgreSQL's own limit for forklift's statements: its claim and completion, no Python work.

`drain(dsn, schema, batch, connections)` empties the ready jobs of a forklift schema with
forklift's own `job_claim_one` and `job_complete_many` (loaded from forklift/store/queries.sql
through forklift._sql.load, exactly as the worker runs them). Each of `connections`
processes (spawned, so no GIL is shared) opens one autocommit connection, waits until all
are connected, then loops "claim up to `batch`, complete those" until a claim comes back
empty. batch 1 is one job per round trip (a worker at --concurrency 1); a larger batch is
what a worker with that many free slots claims at once, completed in one group commit.
bench.compare uses 4 connections: a forklift worker claims on one and completes on
another, and it runs 2 workers. What is left is the server's cost of the statements (and
psycopg's): no handler, no hand-off between threads, no lease renewal. Each claim waits
for its WAL flush, as a worker's claims in a drain do (they carry completions); only a
claim on its own skips the wait.
"""

from __future__ import annotations

import multiprocessing
import time
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from typing import Any

import psycopg

from forklift import _sql


def _loop(dsn: str, schema: str, batch: int, owner: str, go: Barrier, out: Queue[Any]) -> None:
    """One connection's claim/complete loop; puts (started, ended, jobs, error) on `out`."""
    queries = _sql.load("forklift.store", "queries.sql", schema)
    claim = {"queue": "default", "owner": owner, "limit": batch, "lease": 30.0, "alone": False}
    claim["floor"] = None  # each claim reads from where the last said, as a worker's do
    started = ended = 0.0
    done, error = 0, ""
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            go.wait(60)
            started = time.monotonic()  # CLOCK_MONOTONIC: one clock for every process
            while (rows := conn.execute(queries["job_claim_one"], claim).fetchall())[0][0]:
                claim["floor"] = rows[0][-1]  # (one row of NULLs when it took nothing)
                ids = {"ids": [r[0] for r in rows], "attempts": [r[6] for r in rows]}
                done += len(
                    conn.execute(queries["job_complete_many"], ids | {"owner": owner}).fetchall()
                )
            ended = time.monotonic()
    except Exception as exc:  # reported by drain(), which raises
        error = f"{type(exc).__name__}: {exc}"
    out.put((started, ended, done, error))


def drain(dsn: str, schema: str, batch: int, connections: int) -> tuple[float, int]:
    """(seconds, jobs) for `connections` claim/complete loops to empty the schema's ready
    jobs, from the moment all are connected until the last finds nothing left."""
    ctx = multiprocessing.get_context("spawn")
    go, out = ctx.Barrier(connections), ctx.Queue()
    procs = [
        ctx.Process(target=_loop, args=(dsn, schema, batch, f"pg-limit:{i}", go, out))
        for i in range(connections)
    ]
    for p in procs:
        p.start()
    try:
        results = [out.get(timeout=600) for _ in procs]
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [r[3] for r in results if r[3]]
    if errors:
        raise RuntimeError("; ".join(errors))
    return max(r[1] for r in results) - min(r[0] for r in results), sum(r[2] for r in results)
