"""The fair-share fault test's app (tests/faults/test_fair.py): one task, `render`, whose
jobs take turns across the values of `account` (fair shares, forklift/fair.py), each run
recorded as it begins and each job's effect committed once.

Every run (each attempt a handler began) is a row of `{schema}.runs`, written at once on
a connection of its own in autocommit, so a run killed mid-way is recorded too (its
start, with no end). The effect goes to the workload's effects table
(tests/faults/harness.py: no unique key, so a second commit shows as a second row) inside
`ctx.transaction()`. DSN and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA.

`declare(app)` declares the task on any app: the fleet's (below) runs it, the test's own
producer needs the declaration to draw each job's key at enqueue (a producer enqueuing by
name stores no key). With FORKLIFT_TEST_FAIR=off in the environment the task is declared
without `fair=`: run the fault test so once by hand to see it fail.
"""

from __future__ import annotations

import os
import time
import uuid

import psycopg

import forklift
from tests.apps._recording import write

# Short backoffs and room for the faults: a kill costs the job it hits an attempt and a
# crash, a database restart an attempt to each job running through it.
QUICK = forklift.Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0)
ATTEMPTS, CRASHES = 20, 10
FAIR = os.environ.get("FORKLIFT_TEST_FAIR", "on") != "off"

RUNS = """
CREATE TABLE {schema}.runs (
    token    text PRIMARY KEY,        -- one run (a retried insert of it is one row)
    job_id   bigint NOT NULL,
    attempt  integer NOT NULL,
    account  text NOT NULL,
    pid      integer NOT NULL,
    started  timestamptz NOT NULL,    -- the handler's start (database clock)
    ended    timestamptz              -- the handler's end; NULL: killed, or not written
)"""


def declare(app: forklift.App) -> None:
    """Declare `render` on `app` (fair by `account` unless FORKLIFT_TEST_FAIR=off)."""
    schema = app.schema
    options: forklift.TaskOptions = {
        "max_attempts": ATTEMPTS, "max_crashes": CRASHES, "backoff": QUICK,
    }  # fmt: skip
    if FAIR:
        options["fair"] = "account"

    @app.task(name="render", **options)
    def render(ctx: forklift.JobContext, *, account: str, key: str, pause: float) -> str:
        """Record the run's start (a run that cannot does nothing else and fails: every
        run that did anything is seen), sleep `pause`, commit the effect keyed `key`."""
        token = uuid.uuid4().hex
        write(
            app,
            "fair-runs",
            f"INSERT INTO {schema}.runs (token, job_id, attempt, account, pid, started)"
            f" VALUES (%s, %s, %s, %s, %s, clock_timestamp()) ON CONFLICT (token) DO NOTHING",
            (token, ctx.job_id, ctx.attempt, account, os.getpid()),
        )
        time.sleep(pause)  # the window in which a test kills it
        with ctx.transaction() as conn:
            conn.execute(
                f"INSERT INTO {schema}.effects (key, job_id, attempt) VALUES (%s, %s, %s)",
                (key, ctx.job_id, ctx.attempt),
            )
        # An end not written (the database away) leaves the run open.
        try:
            write(
                app,
                "fair-runs",
                f"UPDATE {schema}.runs SET ended = clock_timestamp() WHERE token = %s",
                (token,),
            )
        except psycopg.Error:
            pass
        return key


app = forklift.App()
declare(app)
