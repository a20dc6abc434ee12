"""Claiming ahead, both sides, with real worker processes at the default concurrency 1:
tiny jobs are claimed many per statement, and a long job never hoards the ones behind it."""

from __future__ import annotations

import time
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import scalar, wait_state


def claims_for(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> int:
    """How many claim statements took `ids`: one claim stamps all its jobs with its
    transaction's now() as started_at."""
    return int(
        scalar(db, f"SELECT count(DISTINCT started_at) FROM {schema}.jobs WHERE id = ANY(%s)", ids)
    )


@pytest.mark.parametrize("prefetch", [True, False])
def test_tiny_jobs_are_claimed_many_per_statement_only_with_prefetch(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any, prefetch: bool
) -> None:
    app = forklift.App(dsn, schema=schema)
    ids = app.enqueue_many([("noop", {}) for _ in range(2000)])
    flags = [] if prefetch else ["--no-prefetch"]
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2", *flags)
    wait_for(
        lambda: (
            scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'") == len(ids)
        ),
        timeout=60,
        what="the 2,000 no-ops done",
    )
    claims = claims_for(db, schema, ids)
    if prefetch:
        assert claims <= len(ids) / 10, claims  # many jobs per claim round trip
    else:
        assert claims >= len(ids) / 2, claims  # about one claim per job: slots only
    sup.stop_cleanly()
    app.close()


def test_a_long_job_hoards_nothing_and_the_short_ones_finish_while_it_runs(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2", "--grace", "1")
    # Both workers measure tiny jobs first, so both would claim ahead.
    warm = app.enqueue_many([("noop", {}) for _ in range(200)])
    for job_id in warm:
        wait_state(db, schema, job_id, "succeeded", timeout=30)
    # The long job just before the short ones: the order that would strand them. (A claim that takes
    # the long job with short ones behind it gives them back: tests/integration.)
    long_job = app.enqueue("sleep", {"seconds": 8.0})
    short = app.enqueue_many([("sleep", {"seconds": 0.001}) for _ in range(200)])
    wait_state(db, schema, long_job, "running", timeout=10)
    owner = scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", long_job)
    began = time.monotonic()
    hoarded: list[int] = []

    def shorts_done() -> bool:
        # Past the release budget (20 claim round trips: 0.5 s where a loaded machine's
        # claim of 200 jobs takes 25 ms) it holds the long job alone.
        if time.monotonic() - began > 1.0:
            hoarded.append(
                scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE lease_owner = %s", owner)
            )
        done = scalar(
            db,
            f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded' AND id = ANY(%s)",
            short,
        )
        return bool(done == len(short))

    wait_for(shorts_done, timeout=7, interval=0.05, what="the 200 short jobs done")
    if not hoarded:  # all done within the budget: look once past it, the long job runs on
        time.sleep(max(0.0, began + 1.05 - time.monotonic()))
        shorts_done()
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", long_job) == "running"
    assert hoarded and set(hoarded) == {1}, hoarded  # the long job's worker held nothing else
    failures = f"SELECT count(*) FROM {schema}.jobs WHERE id = ANY(%s) AND errors <> '[]'"
    assert scalar(db, failures, short) == 0  # no short job failed or was charged on the way
    assert scalar(db, f"SELECT attempts FROM {schema}.jobs WHERE id = %s", long_job) == 1
    sup.stop_cleanly(timeout=20)
    app.close()
