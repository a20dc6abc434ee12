"""Workflows in one process: the graph goes in at once, a blocked step is never claimed,
results flow down, failures cancel what needs them (and a retry brings it back), a
running step grows its workflow (forklift/workflow.py, migration 0020). The kills are
in tests/faults/test_workflows.py."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import forklift
from forklift.admin.jobs import JobAdmin
from forklift.errors import ArgumentError, UnknownTaskError
from forklift.store.workflows import WorkflowStore
from forklift.supervisor.workflow_gauges import WorkflowCollector
from forklift.testing import wait_for
from tests.integration.conftest import RunWorker


def states(db: psycopg.Connection[Any], schema: str, workflow_id: int) -> dict[str, str]:
    rows = db.execute(
        f"SELECT step, state::text FROM {schema}.jobs WHERE workflow_id = %s", (workflow_id,)
    )
    return dict(rows.fetchall())


def finished(app: forklift.App, wf: forklift.Workflow) -> str:
    row = wf.wait(timeout=30)
    assert row.finished_at is not None
    return row.state


def test_a_diamond_runs_each_step_once_after_its_upstream_steps(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker,
    task: Callable[..., str],
) -> None:  # fmt: skip
    ran: list[tuple[str, dict[str, Any]]] = []
    lock = threading.Lock()

    def node(ctx: forklift.JobContext, *, name: str) -> str:
        with lock:
            ran.append((name, dict(ctx.upstream.items())))
        return name.upper()

    node_task = task(node)
    wf = app.workflow(name="diamond", context={"day": "2026-12-07"})
    a = wf.add(node_task, {"name": "a"}, name="a")
    b = wf.add(node_task, {"name": "b"}, after=[a], name="b")
    c = wf.add(node_task, {"name": "c"}, after=[a], name="c")
    wf.add(node_task, {"name": "d"}, after=[b, c], name="d")
    workflow_id = wf.enqueue()
    assert states(db, schema, workflow_id) == {
        "a": "ready", "b": "blocked", "c": "blocked", "d": "blocked"
    }  # fmt: skip
    run_worker(concurrency=2)
    assert finished(app, wf) == "succeeded"
    order = [name for name, _ in ran]
    assert sorted(order) == ["a", "b", "c", "d"]
    assert order[0] == "a" and order[-1] == "d"
    seen = dict(ran)
    assert seen["a"] == {} and seen["b"] == {"a": "A"}
    assert seen["d"] == {"b": "B", "c": "C"}


def test_a_blocked_step_is_claimed_by_no_claim(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, task: Callable[..., str]
) -> None:
    def node(ctx: forklift.JobContext) -> None:
        pass

    wf = app.workflow()
    first = wf.add(task(node))
    wf.add("node", after=[first])
    wf.enqueue()
    claimed = app.store.job_claim(["default"], "owner-1", 10, 30.0, expired=True)
    assert [j.id for j in claimed] == [first.id]
    assert app.store.job_claim(["default"], "owner-1", 10, 30.0, expired=True) == []


def test_context_and_upstream_by_id_reach_every_step(
    app: forklift.App, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    seen: dict[str, Any] = {}

    def produce(ctx: forklift.JobContext) -> dict[str, int]:
        assert ctx.workflow is not None
        seen["context"] = ctx.workflow.context
        return {"rows": 3}

    def consume(ctx: forklift.JobContext, *, up: int) -> None:
        seen["by_id"] = ctx.upstream[up]
        seen["by_name"] = ctx.upstream["produce"]

    wf = app.workflow(context={"bucket": "b1"})
    p = wf.add(task(produce))
    wf.add(task(consume), {"up": 0}, after=[p])  # the id is known after enqueue: patched below
    wf._nodes[1] = wf._nodes[1]._replace(job=app._new_job("consume", {"up": -1}))
    wf.enqueue()
    # The upstream id is the produce step's, which enqueue just gave it: set the args now.
    with app.store.pool.connection() as conn:
        conn.execute(
            f"UPDATE {app.schema}.jobs SET args = %s WHERE id = %s",
            (forklift._json.dumps_args({"up": p.id}, 1000), wf.steps[1].id),
        )
    run_worker()
    assert finished(app, wf) == "succeeded"
    assert seen == {"context": {"bucket": "b1"}, "by_id": {"rows": 3}, "by_name": {"rows": 3}}


def test_a_dead_step_cancels_what_needs_it_and_a_retry_brings_it_back(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker,
    task: Callable[..., str],
) -> None:  # fmt: skip
    fail = threading.Event()
    fail.set()
    seen: dict[str, Any] = {}

    def flaky(ctx: forklift.JobContext) -> str:
        if fail.is_set():
            raise RuntimeError("extract broke")
        return "rows"

    def after_it(ctx: forklift.JobContext) -> None:
        pass

    def tolerant(ctx: forklift.JobContext) -> None:
        seen["state"] = ctx.upstream.state("flaky")
        seen["failed"] = ctx.upstream.failed
        with pytest.raises(forklift.UpstreamFailed):
            ctx.upstream["flaky"]

    wf = app.workflow(name="broken")
    a = wf.add(task(flaky, max_attempts=1))
    b = wf.add(task(after_it), after=[a])
    wf.add("after_it", after=[b], name="c")
    wf.add(task(tolerant), after=[a], ignore_failure=True)
    wf.enqueue()
    run_worker()
    assert finished(app, wf) == "failed"
    assert states(db, schema, wf.id or 0) == {
        "flaky": "dead", "after_it": "cancelled", "c": "cancelled", "tolerant": "succeeded"
    }  # fmt: skip
    assert seen["state"] == "dead" and "extract broke" in (seen["failed"]["flaky"] or "")
    error = db.execute(
        f"SELECT last_error, upstream_failed FROM {schema}.jobs WHERE id = %s", (b.id,)
    ).fetchone()
    assert error is not None and error[1] == a.id and "dead" in error[0]

    fail.clear()
    assert a.id is not None
    JobAdmin(app.dsn, schema).job_retry_many([a.id], by="test")
    wait_for(lambda: states(db, schema, wf.id or 0)["c"] == "succeeded", what="c ran")
    assert finished(app, wf) == "succeeded"  # every step succeeded in the end
    assert set(states(db, schema, wf.id or 0).values()) == {"succeeded"}


def test_two_upstream_steps_ending_at_once_release_their_dependent_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Two transactions complete the two upstream jobs concurrently: the dependent's row
    lock orders the decrements; exactly one makes it ready."""
    for i in range(20):
        wf = app.workflow()
        a = wf.add("noop", queue=f"race{i}")
        b = wf.add("noop", queue=f"race{i}")
        d = wf.add("noop", after=[a, b])
        wf.enqueue()
        claimed = app.store.job_claim([f"race{i}"], "owner-1", 10, 30.0, expired=False)
        assert {j.id for j in claimed} == {a.id, b.id}
        go = threading.Barrier(2)

        def complete(job_id: int | None, go: threading.Barrier = go) -> None:
            with psycopg.connect(app.dsn, autocommit=True) as conn:
                go.wait()
                conn.execute(
                    f"UPDATE {schema}.jobs SET state = 'succeeded', lease_owner = NULL, "
                    "lease_until = NULL, completed_at = now() WHERE id = %s",
                    (job_id,),
                )

        threads = [threading.Thread(target=complete, args=(j,)) for j in (a.id, b.id)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        found = db.execute(
            f"SELECT state::text, waiting_on FROM {schema}.jobs WHERE id = %s", (d.id,)
        ).fetchone()
        assert found == ("ready", 0)


def test_a_running_step_grows_its_workflow_before_its_dependents(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker,
    task: Callable[..., str],
) -> None:  # fmt: skip
    seen: dict[str, Any] = {}

    def scan(ctx: forklift.JobContext) -> None:
        assert ctx.workflow is not None
        parts = [ctx.workflow.add("part", {"n": n}) for n in range(3)]
        ctx.workflow.add("merge", after=parts)

    def part(ctx: forklift.JobContext, *, n: int) -> int:
        return n * 10

    def merge(ctx: forklift.JobContext) -> int:
        return sum(v for step, v in ctx.upstream.items() if step != "scan")

    def summary(ctx: forklift.JobContext) -> None:
        seen["report"] = dict(ctx.upstream.items())

    for fn in (scan, part, merge, summary):
        task(fn)
    wf = app.workflow(name="grows")
    s = wf.add("scan")
    wf.add("summary", after=[s])
    wf.enqueue()
    run_worker(concurrency=2)
    assert finished(app, wf) == "succeeded"
    assert seen["report"] == {
        "scan": None, "scan/part": 0, "scan/part#2": 10, "scan/part#3": 20, "scan/merge": 30
    }  # fmt: skip
    assert len(states(db, schema, wf.id or 0)) == 6  # scan, 3 parts, merge, summary


def test_cancelling_a_workflow_cancels_what_has_not_run_and_tells_running_steps(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker,
    task: Callable[..., str],
) -> None:  # fmt: skip
    started = threading.Event()
    told: list[bool] = []

    def long(ctx: forklift.JobContext) -> None:
        started.set()
        told.append(ctx.wait_cancelled(20))

    def later(ctx: forklift.JobContext) -> None:
        pass

    wf = app.workflow()
    first = wf.add(task(long))
    wf.add(task(later), after=[first])
    wf.enqueue()
    run_worker()
    assert started.wait(10)
    marked, jobs = forklift.workflow.cancel(
        WorkflowStore(app.store.pool.connection, schema), app.batches, wf.id or 0, "test"
    )
    assert marked and {j.was for j in jobs} == {"running", "blocked"}
    assert finished(app, wf) == "cancelled"
    wait_for(lambda: told == [True], what="the running step told")


def test_refused_before_anything_is_written(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    other = app.workflow()
    stranger = other.add("noop")
    wf = app.workflow()
    with pytest.raises(ArgumentError, match="another workflow"):
        wf.add("noop", after=[stranger])
    with pytest.raises(ArgumentError, match="delay"):
        wf.add("noop", delay=5)
    with pytest.raises(ArgumentError, match="at least one step"):
        wf.enqueue()
    with pytest.raises(UnknownTaskError):
        wf.add("unknown")
    with pytest.raises(ArgumentError, match="step's name"):
        wf.add("noop", name="bad\x1b[2Jname")
    with pytest.raises(ArgumentError, match="workflow's name"):
        app.workflow(name="x" * 201)
    with pytest.raises(ArgumentError, match="JSON"):
        app.workflow(context={"when": object()})
    count = db.execute(f"SELECT count(*) FROM {schema}.workflows").fetchone()
    assert count == (0,)


def test_chain_and_enqueue_in_the_callers_transaction(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    wf = app.chain(("noop", {}), "noop", ("noop", {}))
    with psycopg.connect(app.dsn) as conn:
        wf.enqueue(conn=conn)
        conn.rollback()
    assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone() == (0,)
    wf = app.chain(("noop", {}), "noop", ("noop", {}))
    with psycopg.connect(app.dsn) as conn:
        wf.enqueue(conn=conn)
    assert [s.name for s in wf.steps] == ["noop", "noop#2", "noop#3"]
    assert states(db, schema, wf.id or 0) == {
        "noop": "ready", "noop#2": "blocked", "noop#3": "blocked"
    }  # fmt: skip


def test_the_workflows_gauge_counts_open_and_finished_workflows(
    app: forklift.App, run_worker: RunWorker, task: Callable[..., str]
) -> None:
    def step(ctx: forklift.JobContext) -> None:
        pass

    name = task(step)
    store = WorkflowStore(app.store.pool.connection, app.schema)
    collector = WorkflowCollector(store)

    def gauge() -> dict[str, float]:
        (family,) = list(collector.collect())
        return {s.labels["state"]: s.value for s in family.samples}

    done = app.chain(name, name)
    done.enqueue()
    open_one = app.workflow()
    open_one.add("noop", queue="nobody-serves-this")
    open_one.enqueue()
    assert gauge() == {"running": 2, "succeeded": 0, "failed": 0, "cancelled": 0}
    run_worker()
    done.wait(timeout=30)
    assert gauge() == {"running": 1, "succeeded": 1, "failed": 0, "cancelled": 0}


def test_drain_runs_a_workflow_to_its_end_in_the_tests_process(
    app: forklift.App, task: Callable[..., str]
) -> None:
    """forklift.testing.drain() is how a user's tests run a workflow (inline mode writes
    no rows): each released step is claimed in turn until none is left."""
    order: list[int] = []

    def link(ctx: forklift.JobContext, *, n: int) -> int:
        order.append(n)
        return n

    name = task(link)
    wf = app.chain(*[(name, {"n": n}) for n in range(5)])
    wf.enqueue()
    forklift.testing.drain(app)
    assert order == [0, 1, 2, 3, 4]
    assert wf.status().state == "succeeded"


def test_inline_mode_refuses_a_workflow_with_a_clear_error(app: forklift.App) -> None:
    wf = app.chain("noop", "noop")
    with forklift.testing.inline(app), pytest.raises(forklift.testing.InlineUnsupported):
        wf.enqueue()


def test_a_full_queue_refuses_a_workflows_ready_steps_and_inserts_nothing(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Steps ready at once count against their queue's max_depth, as an enqueue's jobs
    do; blocked ones wait outside it until they are released."""
    db.execute(
        f"INSERT INTO {schema}.limits (scope, name, max_depth) VALUES ('queue', 'default', 3)"
    )
    db.commit()
    app.enqueue("noop")
    wide = app.workflow()
    roots = [wide.add("noop") for _ in range(3)]
    wide.add("noop", after=roots)
    with pytest.raises(forklift.QueueFull):
        wide.enqueue()
    assert db.execute(f"SELECT count(*) FROM {schema}.workflows").fetchone() == (0,)
    deep = app.chain(*["noop"] * 10)  # one ready step, nine blocked
    deep.enqueue()
    assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone() == (11,)
