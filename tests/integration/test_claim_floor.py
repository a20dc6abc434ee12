"""A worker's claim reads its queue's default-priority jobs from a floor (job_claim_one,
workers/claimer.py Floors), not from the start of the line: so it does not walk the dead
versions of the jobs claimed before it, which pile up while another transaction holds
the horizon back. What turns ready behind a floor waits for a rewind, not for ever."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg

import forklift
from forklift.store import Claim, JobStore, claim_statement
from forklift.testing import wait_for
from tests.integration.conftest import RunWorker, horizon_held

OWNER = "test-host:1:floor"
CHURNED = 5_000  # jobs claimed and completed while the horizon is held


def claim(store: JobStore, limit: int, floor: datetime | None) -> Claim:
    return store.job_claim_next((), ["default"], OWNER, limit, 30.0, expired=False, floor=floor)


def past(db: psycopg.Connection[Any], schema: str, ids: list[int], ago: str = "1 hour") -> None:
    """Make jobs `ids` due `ago`, in id order a millisecond apart."""
    db.execute(
        f"UPDATE {schema}.jobs SET available_at = now() - %s::interval"
        " + (id - %s) * interval '1 millisecond' WHERE id = ANY(%s)",
        (ago, min(ids), ids),
    )


def plan(db: psycopg.Connection[Any], store: JobStore, floor: datetime | None, how: str) -> Any:
    """The plan of a claim of one job from `floor` (EXPLAIN (`how`, FORMAT JSON))."""
    sql, params = claim_statement(store.q, ["default"], OWNER, 1, 30.0, False, (), floor)
    with db.transaction(force_rollback=True):
        row = db.execute(f"EXPLAIN ({how}FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    found = row[0] if isinstance(row[0], list) else json.loads(row[0])
    return found[0]["Plan"]


# The indexes the default priority's branch may read: its own, or (the planner's choice
# where the two cost alike: a line of no fair job) that of every job no limit covers,
# read at priority 0, in the same order and from the same floor.
USUAL = ("jobs_ready_open_idx", "jobs_ready_unlabelled_idx")


def index_buffers(db: psycopg.Connection[Any], store: JobStore, floor: datetime | None) -> int:
    """Buffers the claim's index scans of the default priority read (EXPLAIN ANALYZE)."""
    return sum(
        node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0)
        for node in nodes(plan(db, store, floor, "ANALYZE, BUFFERS, "))
        if node.get("Index Name") in USUAL
    )


def picked_indexes(
    db: psycopg.Connection[Any], store: JobStore, floor: datetime | None
) -> set[str]:
    """The indexes through which the claim's branches pick jobs (EXPLAIN)."""
    everything = nodes(plan(db, store, floor, ""))
    (picked,) = (n for n in everything if n.get("Subplan Name") == "CTE picked")
    return {n["Index Name"] for n in nodes(picked) if n.get("Relation Name") == "jobs"}


def nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", []):
        yield from nodes(child)


def test_a_claim_from_its_floor_does_not_walk_the_jobs_claimed_before_it(
    app: forklift.App, store: JobStore, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """5,000 jobs claimed and completed under a held horizon leave 5,000 dead versions
    in the ready index; a rewind walks them all (their heap pages too), a claim from the
    floor the last one left reads a few pages. Before floors every claim was a rewind."""
    ids = app.enqueue_many([("noop", {}) for _ in range(CHURNED)])
    past(db, schema, ids)
    db.execute(f"VACUUM {schema}.jobs")  # (the versions that moved them)
    with horizon_held(dsn):
        floor = churn(store, None)
        app.enqueue("noop")
        assert index_buffers(db, store, None) > 200  # the held horizon's cost, as it was
        assert index_buffers(db, store, floor) < 20
        assert [j.id for j in claim(store, 5, floor).jobs] == [max(ids) + 1]


def test_each_branch_of_the_claim_reads_its_own_line_when_the_statistics_say_all_are_empty(
    app: forklift.App, store: JobStore, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The ready line is empty at steady state, so the last VACUUM ANALYZE recorded none
    in every index of ready jobs, and a VACUUM under a held horizon removes nothing and
    leaves that count as it was. Every such index then looks alike to the planner: it
    read all three branches through the index of all ready jobs by due time
    (jobs_available_idx, retired by migration 0017), the higher- and lower-priority ones
    from its start, through every dead version (220 ms a claim 8 minutes into a hold at
    1,000 jobs/s), where their own index is empty."""
    app.enqueue_many([("noop", {}) for _ in range(200)])
    floor = churn(store, None)
    db.execute(f"VACUUM ANALYZE {schema}.jobs")  # the line empty, as maintenance finds it
    with horizon_held(dsn):
        app.enqueue_many([("noop", {}) for _ in range(CHURNED)])
        floor = churn(store, floor)
        app.enqueue("noop")
        own = {"jobs_ready_open_ranked_idx", *USUAL}
        for at in (floor, None):  # from the floor, and a rewind
            picked = picked_indexes(db, store, at)
            assert picked <= own and "jobs_ready_open_ranked_idx" in picked, picked


def churn(store: JobStore, floor: datetime | None) -> datetime | None:
    """Claim and complete every ready job, from `floor`; the floor the last claim left."""
    while (made := claim(store, 100, floor)).jobs:
        floor = made.floor
        store.job_complete_many([(j.id, j.attempt, None, None) for j in made.jobs], OWNER)
    return made.floor


def test_a_claim_from_a_floor_leaves_jobs_behind_it_to_a_rewind_but_no_other_priority(
    app: forklift.App, store: JobStore, db: psycopg.Connection[Any], schema: str
) -> None:
    app.enqueue("noop")
    floor = claim(store, 5, None).floor  # it emptied the line: a second before its now()
    assert floor is not None
    behind = app.enqueue("noop")
    urgent, least = app.enqueue("noop", priority=5), app.enqueue("noop", priority=-1)
    past(db, schema, [behind, urgent, least])
    assert [j.id for j in claim(store, 5, floor).jobs] == [urgent, least]
    assert [j.id for j in claim(store, 5, None).jobs] == [behind]


def test_the_next_floor_is_the_last_taken_due_time_or_a_second_before_an_emptied_line(
    app: forklift.App, store: JobStore, db: psycopg.Connection[Any], schema: str
) -> None:
    ids = app.enqueue_many([("noop", {}) for _ in range(4)])
    past(db, schema, ids)
    due = dict(db.execute(f"SELECT id, available_at FROM {schema}.jobs").fetchall())
    filled = claim(store, 2, None)  # it filled: the next one starts at the last it took
    assert [j.id for j in filled.jobs] == ids[:2] and filled.floor == due[ids[1]]
    urgent = app.enqueue("noop", priority=5)
    only_urgent = claim(store, 1, filled.floor)  # filled before reading the default's line
    assert [j.id for j in only_urgent.jobs] == [urgent] and only_urgent.floor == filled.floor
    emptied = claim(store, 5, filled.floor)
    row = db.execute("SELECT now()").fetchone()
    assert row is not None and emptied.floor is not None
    assert [j.id for j in emptied.jobs] == ids[2:]
    assert row[0] - timedelta(seconds=3) < emptied.floor < row[0] - timedelta(seconds=0.9)
    nothing = claim(store, 5, emptied.floor)  # took nothing: it still says where
    assert nothing.jobs == [] and nothing.floor is not None and nothing.floor >= emptied.floor


def test_a_job_made_ready_behind_a_busy_workers_floor_runs_at_its_next_rewind(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """Due an hour ago (a past run_at, a schedule's catch-up; a job given back keeps its
    place in line): behind the floor of a worker claiming new jobs all along."""
    first = app.enqueue_many([("noop", {}) for _ in range(20)])
    run_worker()
    wait_for(lambda: done(db, schema, first), what="the first jobs ran")
    late = app.enqueue("noop", run_at=datetime.now().astimezone() - timedelta(hours=1))
    for _ in range(20):  # the worker keeps claiming from its floor meanwhile
        app.enqueue_many([("noop", {}) for _ in range(5)])
    wait_for(lambda: done(db, schema, [late]), what="the job behind the floor ran")


def done(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> bool:
    row = db.execute(
        f"SELECT count(*) FROM {schema}.jobs WHERE id = ANY(%s) AND state = 'succeeded'", (ids,)
    ).fetchone()
    return row is not None and row[0] == len(ids)
