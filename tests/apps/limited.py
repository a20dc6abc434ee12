"""A test app of limited tasks whose every run is recorded in `{schema}.runs` (see RUNS).

Each handler writes its run through a connection of its own in autocommit, never the
job's effect transaction: a run killed mid-way is recorded too (its start, with no end).
The start row carries the claim's time (`jobs.started_at`, set by the limited claim
under the limit lock) beside the handler's own clock. DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.
"""

from __future__ import annotations

import os
import random
import threading
import time
import uuid
from typing import Any

import psycopg

import forklift

app = forklift.App()
SCHEMA = app.schema

# Short backoffs and room for the faults: a kill costs the jobs it hits an attempt and
# a crash each, and the runs are under a minute.
QUICK = forklift.Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0)
ATTEMPTS, CRASHES = 20, 10

RUNS = """
CREATE TABLE {schema}.runs (
    token    text PRIMARY KEY,        -- one run (a retried insert of it is one row)
    job_id   bigint NOT NULL,
    attempt  integer NOT NULL,
    task     text NOT NULL,
    key      text NOT NULL,
    pid      integer NOT NULL,
    claimed  timestamptz,             -- jobs.started_at of this attempt (the claim's clock)
    started  timestamptz NOT NULL,    -- the handler's start (database clock)
    ended    timestamptz              -- the handler's end; NULL: killed, or not written
)"""

_local = threading.local()


def _recorder() -> psycopg.Connection[Any]:
    """This thread's recording connection, opened in this process (never before a fork)."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or getattr(_local, "pid", None) != os.getpid():
        conn = psycopg.connect(
            app.dsn, autocommit=True, connect_timeout=3, application_name="limited-runs"
        )
        _local.conn, _local.pid = conn, os.getpid()
    return conn


def _write(sql: str, params: tuple[Any, ...]) -> None:
    """Run `sql` on the recorder; once more on a fresh connection if the first broke (a
    database restart). Raises psycopg.Error if both fail."""
    try:
        _recorder().execute(sql, params)
    except psycopg.OperationalError:
        _local.conn = None
        _recorder().execute(sql, params)


def _run(ctx: forklift.JobContext, task: str, key: str, pause: float | None) -> None:
    token = uuid.uuid4().hex
    # The start must be written, or the run would be invisible to the checks: a run
    # that cannot write it does nothing else and fails (its job is retried).
    _write(
        f"INSERT INTO {SCHEMA}.runs (token, job_id, attempt, task, key, pid, claimed, started)"
        f" SELECT %s, %s, %s, %s, %s, %s,"
        f" (SELECT started_at FROM {SCHEMA}.jobs WHERE id = %s AND attempts = %s),"
        f" clock_timestamp()"
        f" ON CONFLICT (token) DO NOTHING",
        (token, ctx.job_id, ctx.attempt, task, key, os.getpid(), ctx.job_id, ctx.attempt),
    )
    time.sleep(random.uniform(0.02, 0.08) if pause is None else pause)
    # An end not written (the database away) leaves the run open: the checks then end
    # it when its attempt was charged, which is no earlier than it really ended.
    try:
        _write(f"UPDATE {SCHEMA}.runs SET ended = clock_timestamp() WHERE token = %s", (token,))
    except psycopg.Error:
        pass


@app.task(
    name="per_key",
    max_attempts=ATTEMPTS,
    max_crashes=CRASHES,
    backoff=QUICK,
    limit=forklift.Limit(concurrency=1, key="k"),
)
def per_key(ctx: forklift.JobContext, *, k: str, n: int, pause: float | None = None) -> None:
    """One at a time per value of `k`."""
    _run(ctx, "per_key", k, pause)


@app.task(
    name="global4",
    max_attempts=ATTEMPTS,
    max_crashes=CRASHES,
    backoff=QUICK,
    limit=forklift.Limit(concurrency=4),
)
def global4(ctx: forklift.JobContext, *, n: int) -> None:
    """Four at a time across every replica."""
    _run(ctx, "global4", "", None)


@app.task(
    name="rated",
    queue="rated",  # out of the way of the fault test's queue-wide limit on "default"
    max_attempts=ATTEMPTS,
    max_crashes=CRASHES,
    backoff=QUICK,
    limit=forklift.Limit(rate=20, per=1.0),
)
def rated(ctx: forklift.JobContext, *, n: int) -> None:
    """Twenty starts in any second across every replica."""
    _run(ctx, "rated", "", None)


@app.task(name="stubborn", max_attempts=1, limit=forklift.Limit(concurrency=1, key="k"))
def stubborn(ctx: forklift.JobContext, *, k: str, seconds: float) -> None:
    """One at a time per `k`, and deaf to a cancel: runs `seconds` whatever happens,
    writing its run's end every 0.1 s as it goes, so a run killed mid-way ends at its
    last sign of life (a little before it really stopped: an overlap it shows is real)."""
    token = uuid.uuid4().hex
    _write(
        f"INSERT INTO {SCHEMA}.runs (token, job_id, attempt, task, key, pid, started, ended)"
        f" VALUES (%s, %s, %s, 'stubborn', %s, %s, clock_timestamp(), clock_timestamp())",
        (token, ctx.job_id, ctx.attempt, k, os.getpid()),
    )
    until = time.monotonic() + seconds
    while time.monotonic() < until:
        time.sleep(0.1)
        _write(f"UPDATE {SCHEMA}.runs SET ended = clock_timestamp() WHERE token = %s", (token,))
