"""PostgreSQL's own limit for forklift's statements: its claim and completion, no Python work.

`drain(dsn, schema, batch, connections)` empties the ready jobs of a forklift schema
with forklift's own `job_claim` and `job_complete_many` (loaded from
forklift/store/queries.sql through forklift._sql.load, exactly as the worker runs them):
each of `connections` threads loops "claim up to `batch`, complete those" on its own
autocommit connection until a claim comes back empty. batch 1 is one job per round trip
(what a worker at --concurrency 1 does); a larger batch is what a worker with that many
free slots claims at once, completed in one group commit. There is no handler, no
thread hand-off, no lease renewal: what is left is the server's cost of the statements
(and psycopg's), the ceiling forklift's drain rate is a share of.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg

from forklift import _sql


def _loop(dsn: str, queries: dict[str, str], batch: int, owner: str, errors: list[str]) -> None:
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            claim = {"queues": ["default"], "owner": owner, "limit": batch}
            claim |= {"lease": 30.0, "expired": False}
            while rows := conn.execute(queries["job_claim"], claim).fetchall():
                done = {"ids": [r[0] for r in rows], "attempts": [r[6] for r in rows]}
                conn.execute(queries["job_complete_many"], done | {"owner": owner}).fetchall()
    except Exception as exc:  # reported by drain(), which raises
        errors.append(f"{type(exc).__name__}: {exc}")


def drain(dsn: str, schema: str, batch: int, connections: int) -> float:
    """Seconds `connections` claim/complete loops take to empty the schema's ready jobs."""
    queries = _sql.load("forklift.store", "queries.sql", schema)
    errors: list[str] = []
    threads = [
        threading.Thread(target=_loop, args=(dsn, queries, batch, f"pg-limit:{i}", errors))
        for i in range(connections)
    ]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return time.perf_counter() - started


def completed(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute(f"SELECT count(*) FROM \"{schema}\".jobs WHERE state = 'succeeded'").fetchone()
    return 0 if row is None else int(row[0])
