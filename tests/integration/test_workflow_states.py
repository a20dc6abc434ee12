"""The workflow state machine in the database (migration 0020's triggers), moved by the
statements operators and workers use, or by a plain UPDATE of a job's state: whichever
statement moves an upstream job, its dependents follow in the same transaction."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

import forklift
from forklift.admin.jobs import JobAdmin
from forklift.shown import jobview
from forklift.store.workflows import WorkflowStore


def state_of(db: psycopg.Connection[Any], schema: str, job_id: int | None) -> tuple[Any, ...]:
    found = db.execute(
        f"SELECT state::text, waiting_on, upstream_failed FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert found is not None
    return tuple(found)


def by_state(db: psycopg.Connection[Any], schema: str, workflow_id: int | None) -> dict[str, int]:
    rows = db.execute(
        f"SELECT state::text, count(*) FROM {schema}.jobs WHERE workflow_id = %s GROUP BY 1",
        (workflow_id,),
    )
    return dict(rows.fetchall())


def move(db: psycopg.Connection[Any], schema: str, job_id: int | None, state: str) -> None:
    """What a worker's completion or a supervisor's charge does to the row's state."""
    db.execute(
        f"UPDATE {schema}.jobs SET state = %s, completed_at = now(), lease_owner = NULL, "
        "lease_until = NULL WHERE id = %s",
        (state, job_id),
    )
    db.commit()


def test_an_operators_cancel_of_a_blocked_step_cascades_and_its_retry_restores(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    wf = app.workflow()
    a = wf.add("noop")
    b = wf.add("noop", after=[a])
    c = wf.add("noop", after=[b])
    wf.enqueue()
    admin = JobAdmin(app.dsn, schema)
    (cancelled,) = admin.job_cancel_many([b.id or 0], by="test")
    assert cancelled.done and cancelled.was == "blocked"
    assert state_of(db, schema, b.id) == ("cancelled", 1, None)
    assert state_of(db, schema, c.id) == ("cancelled", 1, b.id)
    (retried,) = admin.job_retry_many([b.id or 0], by="test")
    assert retried.done and retried.became == "blocked"
    assert "blocked until its upstream jobs succeed" in jobview.retry_line(retried)
    # b still waits for a: blocked, not ready; c comes back with it.
    assert state_of(db, schema, b.id) == ("blocked", 1, None)
    assert state_of(db, schema, c.id) == ("blocked", 1, None)
    move(db, schema, a.id, "succeeded")
    assert state_of(db, schema, b.id) == ("ready", 0, None)


def test_a_retry_of_a_step_whose_upstream_is_still_dead_leaves_it_cancelled(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    wf = app.workflow()
    a = wf.add("noop")
    b = wf.add("noop", after=[a])
    wf.enqueue()
    move(db, schema, a.id, "dead")
    assert state_of(db, schema, b.id) == ("cancelled", 1, a.id)
    (refused,) = JobAdmin(app.dsn, schema).job_retry_many([b.id or 0], by="test")
    assert not refused.done and refused.became == "cancelled"
    assert "retry that one" in jobview.retry_line(refused)
    assert state_of(db, schema, b.id) == ("cancelled", 1, a.id)


def test_a_chain_of_a_thousand_cancels_and_comes_back_in_one_statement_each(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A recursive walk, not nested triggers: no stack depth limit, whatever the depth."""
    wf = app.chain(*["noop"] * 1000)
    wf.enqueue()
    head = wf.steps[0]
    move(db, schema, head.id, "dead")
    counts = by_state(db, schema, wf.id)
    assert counts == {"dead": 1, "cancelled": 999}
    assert wf.status().state == "failed"
    JobAdmin(app.dsn, schema).job_retry_many([head.id or 0], by="test")
    counts = by_state(db, schema, wf.id)
    assert counts == {"ready": 1, "blocked": 999}
    assert wf.status().state == "running"


def test_an_edge_that_ignores_failure_releases_and_waits_again_on_a_retry(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    wf = app.workflow()
    a = wf.add("noop")
    ok = wf.add("noop")
    d = wf.add("noop", after=[a, ok], ignore_failure=True)
    wf.enqueue()
    move(db, schema, a.id, "dead")
    assert state_of(db, schema, d.id) == ("blocked", 1, None)
    move(db, schema, ok.id, "succeeded")
    assert state_of(db, schema, d.id) == ("ready", 0, None)
    JobAdmin(app.dsn, schema).job_retry_many([a.id or 0], by="test")
    assert state_of(db, schema, d.id) == ("blocked", 1, None)  # not started: waits again
    move(db, schema, a.id, "succeeded")
    assert state_of(db, schema, d.id) == ("ready", 0, None)


def test_one_statement_ending_many_upstream_jobs_releases_each_dependent_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A group completion ends several steps in one statement: a fan-in's dependent is
    decremented once per upstream job, released once."""
    wf = app.workflow()
    ups = [wf.add("noop") for _ in range(50)]
    d = wf.add("noop", after=ups)
    e = wf.add("noop", after=ups[:10])
    wf.enqueue()
    ids = [u.id for u in ups]
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() WHERE id = ANY(%s)",
        (ids[:49],),
    )
    db.commit()
    assert state_of(db, schema, d.id) == ("blocked", 1, None)
    assert state_of(db, schema, e.id) == ("ready", 0, None)
    move(db, schema, ids[49], "succeeded")
    assert state_of(db, schema, d.id) == ("ready", 0, None)


def test_retention_and_purges_keep_an_unfinished_workflows_jobs(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    wf = app.workflow()
    a = wf.add("noop")
    b = wf.add("noop", after=[a])
    wf.enqueue()
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', "
        "completed_at = now() - interval '30 days' WHERE id = %s",
        (a.id,),
    )
    db.commit()
    assert app.store.job_prune(keep_finished=60.0, keep_dead=60.0) == 0
    assert state_of(db, schema, b.id) == ("ready", 0, None)  # released, and a kept
    move(db, schema, b.id, "succeeded")
    assert wf.status().state == "succeeded"
    db.execute(
        f"UPDATE {schema}.jobs SET completed_at = now() - interval '30 days' "
        "WHERE workflow_id = %s",
        (wf.id,),
    )
    db.commit()
    assert app.store.job_prune(keep_finished=60.0, keep_dead=60.0) == 2


def test_the_sweep_finishes_a_workflow_whose_last_end_went_unseen_and_says_so(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Its last two jobs ended at once, each seeing the other open: nothing marked it."""
    wf = app.chain("noop", "noop")
    wf.enqueue()
    for step in wf.steps:
        move(db, schema, step.id, "succeeded")
    db.execute(
        f"UPDATE {schema}.workflows SET finished_at = NULL, outcome = NULL WHERE id = %s",
        (wf.id,),
    )
    db.commit()
    store = WorkflowStore(app.store.pool.connection, schema)
    assert store.sweep(0, 100) == ([wf.id], 1)
    assert wf.status().state == "succeeded"
    assert store.sweep(0, 100) == ([], 0)


def test_cancelling_a_workflow_with_no_open_job_finishes_it_as_it_ended(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    wf = app.chain("noop")
    wf.enqueue()
    move(db, schema, wf.steps[0].id, "succeeded")
    db.execute(
        f"UPDATE {schema}.workflows SET finished_at = NULL, outcome = NULL WHERE id = %s",
        (wf.id,),
    )
    db.commit()
    store = WorkflowStore(app.store.pool.connection, schema)
    marked, jobs = forklift.workflow.cancel(store, app.batches, wf.id or 0, "test")
    assert (marked, jobs) == (False, [])
    assert wf.status().state == "succeeded"


def test_group_completions_crossing_each_others_dependents_never_deadlock(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Two statements each end two upstream jobs whose dependents cross (u1 and u2 need
    d2 and d1, u3 and u4 need d1 and d2): the settling locks every dependent of its
    statement in id order, so the two queue on a row instead of deadlocking (a row at a
    time, the first statement locked d2 then d1, the other d1 then d2)."""
    failures: list[BaseException] = []
    for _ in range(40):
        wf = app.workflow()
        u1, u2, u3, u4 = (wf.add("noop") for _ in range(4))
        wf.add("noop", after=[u2, u3], name="d1")
        wf.add("noop", after=[u1, u4], name="d2")
        wf.enqueue()
        go = threading.Barrier(2)

        def complete(ids: list[int | None], go: threading.Barrier = go) -> None:
            try:
                with psycopg.connect(app.dsn, autocommit=True) as conn:
                    go.wait()
                    conn.execute(
                        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now()"
                        " FROM unnest(%s::bigint[]) WITH ORDINALITY AS o(id, n)"
                        f" WHERE {schema}.jobs.id = o.id",
                        (ids,),
                    )
            except BaseException as exc:
                failures.append(exc)

        threads = [
            threading.Thread(target=complete, args=([u1.id, u2.id],)),
            threading.Thread(target=complete, args=([u4.id, u3.id],)),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert wf.status().counts == {"succeeded": 4, "ready": 2}
