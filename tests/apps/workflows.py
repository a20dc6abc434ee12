"""The workflow fault tests' app (tests/faults/test_workflows.py): steps that record every
run they begin and commit one effect each, a step that grows its workflow, and a step
under a concurrency limit.

Every run (each attempt a handler began) is a row of `{schema}.runs`, written at once
on a connection of its own in autocommit, so a run killed mid-way is recorded too (its
start, with no end). Its layout is tests/apps/limited.py's RUNS, so that
tests/faults/test_limits.py's `runs_of` reads it. The effect goes to the workload's
effects table (tests/faults/harness.py: no unique key, so a second commit shows as a
second row) inside `ctx.transaction()`, with what the step saw of its upstream steps
(`seen`). Every change of a workflow job's state is a row of `{schema}.moves`, written
by a trigger in the transaction that made it. DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.
"""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

import forklift

app = forklift.App()
SCHEMA = app.schema

# Short backoffs and room for the faults: a kill costs the step it hits an attempt and
# a crash, a database restart an attempt to each step running through it.
QUICK = forklift.Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0)
ATTEMPTS, CRASHES = 20, 10

TABLES = """
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
);
ALTER TABLE {schema}.effects ADD COLUMN seen jsonb;  -- each upstream step's result, by name
CREATE TABLE {schema}.moves (
    n          bigserial PRIMARY KEY,  -- a job's moves in order: its row lock orders them
    job_id     bigint NOT NULL,
    old        text NOT NULL,
    new        text NOT NULL,
    waiting_on integer NOT NULL,
    at         timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE FUNCTION {schema}.workflow_job_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.moves (job_id, old, new, waiting_on)
    VALUES (NEW.id, OLD.state::text, NEW.state::text, NEW.waiting_on);
    RETURN NULL;
END $$;
CREATE TRIGGER workflow_job_moved AFTER UPDATE OF state ON {schema}.jobs FOR EACH ROW
    WHEN (NEW.workflow_id IS NOT NULL AND OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION {schema}.workflow_job_moved();
"""

_local = threading.local()


def _recorder() -> psycopg.Connection[Any]:
    """This thread's recording connection, opened in this process (never before a fork)."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    if conn is None or conn.closed or getattr(_local, "pid", None) != os.getpid():
        conn = psycopg.connect(
            app.dsn, autocommit=True, connect_timeout=3, application_name="workflow-runs"
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


def _begin(ctx: forklift.JobContext, task: str, key: str) -> str:
    """Record the run's start; its token. A run that cannot record it does nothing else
    and fails (its job runs again): every run that did anything is seen."""
    token = uuid.uuid4().hex
    _write(
        f"INSERT INTO {SCHEMA}.runs (token, job_id, attempt, task, key, pid, claimed, started)"
        f" SELECT %s, %s, %s, %s, %s, %s,"
        f" (SELECT started_at FROM {SCHEMA}.jobs WHERE id = %s AND attempts = %s),"
        f" clock_timestamp()"
        f" ON CONFLICT (token) DO NOTHING",
        (token, ctx.job_id, ctx.attempt, task, key, os.getpid(), ctx.job_id, ctx.attempt),
    )
    return token


def _end(token: str) -> None:
    # An end not written (the database away) leaves the run open: the checks end it
    # when its attempt was charged, no earlier than it really ended.
    try:
        _write(f"UPDATE {SCHEMA}.runs SET ended = clock_timestamp() WHERE token = %s", (token,))
    except psycopg.Error:
        pass


def _effect(ctx: forklift.JobContext, key: str) -> None:
    """The step's effect, committed with its completion: one row, with the results of its
    upstream steps as it read them (UpstreamFailed if one had not succeeded)."""
    with ctx.transaction() as conn:
        seen = dict(ctx.upstream.items())
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (key, job_id, attempt, seen) VALUES (%s, %s, %s, %s)",
            (key, ctx.job_id, ctx.attempt, Jsonb(seen)),
        )


def _run(ctx: forklift.JobContext, task: str, key: str, pause: float) -> str:
    token = _begin(ctx, task, key)
    time.sleep(pause)  # the window in which a test kills it
    _effect(ctx, key)
    _end(token)
    return key


@app.task(name="step", max_attempts=ATTEMPTS, max_crashes=CRASHES, backoff=QUICK)
def step(ctx: forklift.JobContext, *, key: str, pause: float = 0.0) -> str:
    """A step: its run recorded, `pause` seconds, its effect; its result is its key."""
    return _run(ctx, "step", key, pause)


@app.task(name="scan", max_attempts=ATTEMPTS, max_crashes=CRASHES, backoff=QUICK)
def scan(
    ctx: forklift.JobContext, *, key: str, parts: int, every: float, holds: list[int], hold: float
) -> str:
    """Grow the workflow: `parts` steps `part-<n>` (those in `holds` pausing `hold`
    seconds), one every `every` seconds, each committed at once, then `merge` after all
    of them; then its own effect. A retry adds the same steps by the same names: those
    added already are found, not added twice."""
    token = _begin(ctx, "scan", key)
    workflow = ctx.workflow
    assert workflow is not None, "a scan outside a workflow"
    added = []
    for n in range(parts):
        args = {"key": f"{key}/part-{n}", "pause": hold if n in holds else 0.0}
        added.append(workflow.add("step", args, name=f"part-{n}"))
        time.sleep(every)
    workflow.add("step", {"key": f"{key}/merge"}, after=added, name="merge")
    _effect(ctx, key)
    _end(token)
    return key


@app.task(
    name="solo",
    max_attempts=ATTEMPTS,
    max_crashes=CRASHES,
    backoff=QUICK,
    limit=forklift.Limit(concurrency=1),
)
def solo(ctx: forklift.JobContext, *, key: str, pause: float = 0.0) -> str:
    """A step of which one runs at a time across every replica."""
    return _run(ctx, "solo", key, pause)
