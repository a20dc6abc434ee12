"""The unique-jobs fault test's app (tests/faults/test_unique.py): two unique tasks, `sync`
(unique by `key`, in ready and running) and `ping` (the same within each PERIOD seconds),
whose runs are recorded as they begin and whose effects commit once per job.

Every run (each attempt a handler began) is a row of `{schema}.runs`, written at once on
a connection of its own in autocommit, so a run killed mid-way is recorded too (its
start, with no end). The effect goes to the workload's effects table
(tests/faults/harness.py: no unique key, so a second commit shows as a second row) inside
`ctx.transaction()`. Every change of a job's state (or key) is a row of
`{schema}.unique_moves`, written at the commit of the transaction that made it, numbered
in commit order (TABLES; the test's docstring says why the numbers are that order). DSN
and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.

`declare(app)` declares the tasks on any app: the fleet's (below) runs them, the test's
producers need the declarations to draw each job's unique key at enqueue. With
FORKLIFT_TEST_UNIQUE_INDEX=off in the environment, TABLES drops migration 0022's unique
index from the test's schema: run the fault test so once by hand to see it fail.
"""

from __future__ import annotations

import os
import random
import time
import uuid

import psycopg

import forklift
from tests.apps._recording import write

# Short backoffs and room for the faults: a kill costs the job it hits an attempt and a
# crash, a database restart an attempt to each job running through it.
QUICK = forklift.Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0)
ATTEMPTS, CRASHES = 20, 10
PERIOD = 1.0  # seconds: ping's unique period, so that its keys are freed by the clock too
PAUSE = (0.05, 0.1)  # seconds a run sleeps, drawn in this range: the window of a kill
INDEX = os.environ.get("FORKLIFT_TEST_UNIQUE_INDEX", "on") != "off"

# The moves are written by a deferred constraint trigger, so at the commit of the
# transaction that made them (a rolled-back move leaves none), after its last statement.
# The first move of a transaction takes the schema's commit lock, held until its commit
# is visible (PostgreSQL releases a transaction's locks after that), and the next commit
# number under it: the numbers order these transactions as every snapshot sees them.
# `unique_mark()` takes the same lock: the number it returns is that of the last of them
# to have committed, and every one numbered after it commits after it.
TABLES = """
CREATE TABLE {schema}.runs (
    token    text PRIMARY KEY,        -- one run (a retried insert of it is one row)
    job_id   bigint NOT NULL,
    attempt  integer NOT NULL,
    task     text NOT NULL,
    key      text NOT NULL,
    pid      integer NOT NULL,
    pause    float8 NOT NULL,         -- seconds it sleeps before its effect
    started  timestamptz NOT NULL,    -- the handler's start (database clock)
    ended    timestamptz              -- the handler's end; NULL: killed, or not written
);
CREATE SEQUENCE {schema}.unique_commits;
CREATE TABLE {schema}.unique_moves (
    n          bigserial PRIMARY KEY,  -- the moves of one transaction in the order made
    commit_n   bigint NOT NULL,        -- the transaction's place in commit order
    job_id     bigint NOT NULL,
    unique_key text,                   -- NULL: the job is not unique
    state      text NOT NULL,
    holds      boolean NOT NULL,       -- in its own unique states: holding its key
    at         timestamptz NOT NULL DEFAULT clock_timestamp()  -- just before the commit
);
CREATE FUNCTION {schema}.unique_commit_n() RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    mine text := current_setting('forklift_test.commit_n', true);
BEGIN
    IF coalesce(mine, '') = '' THEN
        PERFORM pg_advisory_xact_lock(hashtext('{schema}.unique_commits'));
        mine := nextval('{schema}.unique_commits')::text;
        PERFORM set_config('forklift_test.commit_n', mine, true);
    END IF;
    RETURN mine::bigint;
END $$;
CREATE FUNCTION {schema}.unique_mark() RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(hashtext('{schema}.unique_commits'));
    RETURN (SELECT CASE WHEN is_called THEN last_value ELSE 0 END
            FROM {schema}.unique_commits);
END $$;
CREATE FUNCTION {schema}.unique_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        INSERT INTO {schema}.unique_moves (commit_n, job_id, unique_key, state, holds)
        VALUES ({schema}.unique_commit_n(), OLD.id, OLD.unique_key, 'deleted', false);
    ELSE
        INSERT INTO {schema}.unique_moves (commit_n, job_id, unique_key, state, holds)
        VALUES ({schema}.unique_commit_n(), NEW.id, NEW.unique_key, NEW.state::text,
                coalesce({schema}.unique_holds(NEW.state, NEW.unique_states), false));
    END IF;
    RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER unique_moved
    AFTER INSERT OR UPDATE OF state, unique_key, unique_states OR DELETE ON {schema}.jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {schema}.unique_moved();
"""
NO_INDEX = "DROP INDEX {schema}.jobs_unique_idx;"


def tables(schema: str) -> str:
    """TABLES for `schema`, and the unique index dropped if FORKLIFT_TEST_UNIQUE_INDEX=off."""
    return (TABLES if INDEX else TABLES + NO_INDEX).format(schema=schema)


def _run(app: forklift.App, ctx: forklift.JobContext, task: str, key: str) -> str:
    """Record the run's start (a run that cannot does nothing else and fails: every run
    that did anything is seen), sleep a PAUSE, commit the effect keyed `key`."""
    schema, token, pause = app.schema, uuid.uuid4().hex, random.uniform(*PAUSE)
    write(
        app,
        "unique-runs",
        f"INSERT INTO {schema}.runs (token, job_id, attempt, task, key, pid, pause, started)"
        f" VALUES (%s, %s, %s, %s, %s, %s, %s, clock_timestamp())"
        f" ON CONFLICT (token) DO NOTHING",
        (token, ctx.job_id, ctx.attempt, task, key, os.getpid(), pause),
    )
    time.sleep(pause)  # the window in which a test kills it
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {schema}.effects (key, job_id, attempt) VALUES (%s, %s, %s)",
            (key, ctx.job_id, ctx.attempt),
        )
    # An end not written (the database away) leaves the run open.
    try:
        ended = f"UPDATE {schema}.runs SET ended = clock_timestamp() WHERE token = %s"
        write(app, "unique-runs", ended, (token,))
    except psycopg.Error:
        pass
    return key


def declare(app: forklift.App) -> None:
    """Declare `sync` and `ping` on `app`."""

    def options(unique: forklift.Unique) -> forklift.TaskOptions:
        return {
            "max_attempts": ATTEMPTS,
            "max_crashes": CRASHES,
            "backoff": QUICK,
            "unique": unique,
        }

    @app.task(name="sync", **options(forklift.Unique(keys=["key"])))
    def sync(ctx: forklift.JobContext, *, key: str, n: int) -> str:
        """At most one live job per `key`; `n` tells one enqueue's arguments from another's."""
        return _run(app, ctx, "sync", key)

    @app.task(name="ping", **options(forklift.Unique(keys=["key"], period=PERIOD)))
    def ping(ctx: forklift.JobContext, *, key: str, n: int) -> str:
        """At most one live job per `key` and PERIOD of the database's clock."""
        return _run(app, ctx, "ping", key)


app = forklift.App()
declare(app)
