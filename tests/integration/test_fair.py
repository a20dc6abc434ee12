"""Fair shares: turns dealt at insert (migration 0023), the claim in turn order
(store/fair.sql), the plain claim leaving fair jobs to it, a worker that switches to it
as fair jobs come, and the declarations refused."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.admin import JobAdmin
from forklift.shown.jobview import print_detail
from forklift.store import claim_statement
from forklift.store.limits import LimitStore
from forklift.testing import wait_for
from forklift.workers import Worker, WorkerConfig

Db = psycopg.Connection[Any]
OWNER = "test-host:1:fair"


@pytest.fixture
def app(dsn: str, schema: str) -> Iterator[forklift.App]:
    a = forklift.App(dsn, schema=schema)

    @a.task(fair="account")
    def render(ctx: forklift.JobContext, *, account: str, n: int = 0) -> None: ...

    @a.task(fair=lambda args: args["tier"].lower(), weights={"gold": 3})
    def report(ctx: forklift.JobContext, *, tier: str, n: int = 0) -> None: ...

    @a.task
    def plain(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    a.migrate()
    yield a
    a.close()


def claim(app: forklift.App, n: int, *, fair: bool = True, queues: list[str] | None = None) -> Any:
    return app.store.job_claim_next(
        (), queues or ["default"], OWNER, n, 30.0, expired=False, fair=fair
    )


def keys(jobs: list[Any]) -> list[str]:
    return [j.args.get("account") or j.args.get("tier") or "plain" for j in jobs]


def test_a_backlog_does_not_hold_up_a_key_that_comes_after_it(app: forklift.App) -> None:
    app.enqueue_many([("render", {"account": "big", "n": i}) for i in range(100)])
    for account in ("a", "b", "c"):
        app.enqueue("render", {"account": account})
    first = Counter(keys(claim(app, 8).jobs))
    # Each newcomer is in the first turns, not behind 100 jobs of "big".
    assert first == {"big": 5, "a": 1, "b": 1, "c": 1}
    # With the newcomers served, "big" gets every slot: nothing is reserved.
    assert keys(claim(app, 20).jobs) == ["big"] * 20


def test_two_keys_with_backlogs_take_turns_and_a_weight_takes_more(app: forklift.App) -> None:
    app.enqueue_many([("render", {"account": "x", "n": i}) for i in range(10)])
    app.enqueue_many([("render", {"account": "y", "n": i}) for i in range(10)])
    taken = keys(claim(app, 10).jobs)
    assert Counter(taken) == {"x": 5, "y": 5}
    app.enqueue_many([("report", {"tier": "gold", "n": i}) for i in range(30)])
    app.enqueue_many([("report", {"tier": "free", "n": i}) for i in range(30)])
    # The newcomers start at the head's turn, beside the rest of x and y; gold takes
    # three turns to free's one (and to x's and y's).
    jobs = claim(app, 18).jobs
    reports = Counter(keys([j for j in jobs if j.task == "report"]))
    assert reports == {"gold": 9, "free": 3}, keys(jobs)


def test_plain_jobs_in_a_fair_queue_take_turns_as_one_key(app: forklift.App) -> None:
    app.enqueue_many([("render", {"account": "big", "n": i}) for i in range(50)])
    app.enqueue_many([("plain", {"n": i}) for i in range(50)])
    taken = Counter(keys(claim(app, 20).jobs))
    assert taken == {"big": 10, "plain": 10}


def test_a_retried_job_keeps_its_turn(app: forklift.App, db: Db, schema: str) -> None:
    app.enqueue_many([("render", {"account": "big", "n": i}) for i in range(5)])
    (job,) = claim(app, 1).jobs
    turn = db.execute(f"SELECT fair_turn FROM {schema}.jobs WHERE id = %s", (job.id,)).fetchone()
    app.store.job_release_many([(job.id, job.attempt)], OWNER)
    after = db.execute(f"SELECT fair_turn FROM {schema}.jobs WHERE id = %s", (job.id,)).fetchone()
    assert after == turn
    assert claim(app, 1).jobs[0].id == job.id


def test_a_job_waiting_for_its_time_holds_no_turn(app: forklift.App, db: Db, schema: str) -> None:
    """A job due later (a delay, a retry's backoff) holds no turn, so it neither holds
    the head back (a newcomer would be dealt turns below the backlog waiting) nor counts
    as its key's backlog (its key's next job would queue behind it). Found by the fault
    test's author: before migration 0023 dealt turns to due jobs only, the newcomer's 30
    jobs went before all 50 of the backlog, and the planner's job due now after 100
    scheduled ones stood behind the whole backlog."""
    app.enqueue_many([("render", {"account": "old", "n": i}) for i in range(100)])
    app.enqueue("render", {"account": "later"}, delay=3600)
    app.enqueue_many(
        [forklift.JobSpec("render", {"account": "planner", "n": i}, delay=3600) for i in range(5)]
    )
    claim(app, 50)  # old's first 50 run; its 50 others wait
    app.enqueue_many([("render", {"account": "new", "n": i}) for i in range(30)])
    assert Counter(keys(claim(app, 20).jobs)) == {"old": 10, "new": 10}
    app.enqueue("render", {"account": "planner", "n": 99})
    assert "planner" in keys(claim(app, 3).jobs)
    turns = db.execute(
        f"SELECT count(*) FROM {schema}.jobs WHERE available_at > now() AND fair_turn IS NOT NULL"
    ).fetchone()
    assert turns == (0,)


def test_a_retried_job_gives_up_its_turn_and_comes_back_once_due(
    app: forklift.App, db: Db, schema: str
) -> None:
    """A failure with a backoff gives the job's turn up (it is due later); once due it is
    claimed as a job that arrives then: beside the head, not behind the backlog."""
    app.enqueue("render", {"account": "flaky"})
    app.enqueue_many([("render", {"account": "big", "n": i}) for i in range(50)])
    (job,) = [j for j in claim(app, 2).jobs if j.args["account"] == "flaky"]
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'ready', lease_owner = NULL, lease_until = NULL,"
        " available_at = now() + interval '1 hour' WHERE id = %s",
        (job.id,),
    )
    row = db.execute(f"SELECT fair_turn FROM {schema}.jobs WHERE id = %s", (job.id,)).fetchone()
    assert row == (None,)
    db.execute(f"UPDATE {schema}.jobs SET available_at = now() WHERE id = %s", (job.id,))
    assert "flaky" in keys(claim(app, 2).jobs)


def test_the_plain_claim_leaves_fair_jobs_and_says_they_wait(app: forklift.App) -> None:
    app.enqueue("render", {"account": "a"})
    app.enqueue("plain", {})
    made = claim(app, 5, fair=False)
    assert keys(made.jobs) == ["plain"]
    assert made.fair_waiting
    # The claims of several queues (and those under limits) read every job: a fair job
    # is never left to a claim that does not come.
    app.enqueue("render", {"account": "b"})
    multi = claim(app, 5, fair=False, queues=["default", "other"])
    assert sorted(keys(multi.jobs)) == ["a", "b"]


def test_the_fair_claim_reads_each_line_through_its_own_index(
    app: forklift.App, db: Db, schema: str
) -> None:
    app.enqueue_many([("render", {"account": "big", "n": i}) for i in range(2000)])
    app.enqueue("plain", {})
    db.execute(f"ANALYZE {schema}.jobs")
    sql, params = claim_statement(
        app.store.q, ["default"], OWNER, 4, 30.0, False, (), None, fair=True
    )
    with db.transaction(force_rollback=True):
        row = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    scans = {
        n["Index Name"]: n.get("Rows Removed by Filter", 0)
        for n in _nodes(plan[0]["Plan"])
        if "Index Name" in n
    }
    assert "jobs_ready_fair_idx" in scans, scans
    # the plain line does not walk past the 2,000 fair jobs to find its one
    plain_scans = {k: v for k, v in scans.items() if "open" in k or "unlimited" in k}
    assert plain_scans and all(v == 0 for v in plain_scans.values()), scans


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def test_an_idle_worker_takes_a_fair_job_at_once_and_serves_keys_in_turns(
    app: forklift.App,
) -> None:
    """A worker that claimed plainly (no fair jobs waited at its last lookup) is told by
    its plain claim that fair jobs wait, and claims them in turns at once: a newcomer's
    job starts within a few jobs of a backlog enqueued before it."""
    order: list[str] = []
    gate = threading.Event()

    def record(ctx: forklift.JobContext, *, account: str, n: int = 0) -> None:
        gate.wait(10)
        order.append(account)

    app.tasks["render"].fn = record
    worker = Worker(app, WorkerConfig(concurrency=1, maintenance=False, prefetch=False))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        app.enqueue("plain", {})  # its first lookup finds no fair job
        wait_for(lambda: _count(app, "succeeded") == 1, what="the plain job done")
        app.enqueue_many([("render", {"account": "big", "n": i}) for i in range(40)])
        wait_for(lambda: _count(app, "running") == 1, what="a big job started")
        app.enqueue("render", {"account": "small"})
        gate.set()
        wait_for(lambda: "small" in order, timeout=20, what="the small key's job run")
        assert order.index("small") <= 2, order
    finally:
        gate.set()
        worker.request_stop(fast=True)
        thread.join(timeout=15)


def _count(app: forklift.App, state: str) -> int:
    with psycopg.connect(app.dsn) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM {app.schema}.jobs WHERE state = %s", (state,)
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"fair": "acount"}, r"fair='acount' names no argument .*takes: account"),
        ({"fair": 3}, "fair must be an argument name or a callable"),
        ({"weights": {"a": 2}}, "weights= needs fair="),
        ({"fair": "account", "weights": {"a": 0}}, r"weights\['a'\] must be a number > 0"),
        ({"fair": "account", "weights": 5}, "weights must be a mapping"),
        (
            {"fair": "account", "limit": forklift.Limit(concurrency=1)},
            "fair= and limit= together are not supported yet",
        ),
    ],
)
def test_bad_declarations_are_refused(options: dict[str, Any], message: str) -> None:
    app = forklift.App("postgresql://unused/x")

    def handler(ctx: forklift.JobContext, *, account: str) -> None: ...

    with pytest.raises(forklift.ConfigError, match=message):
        app.task(**options)(handler)


def test_a_job_whose_key_cannot_be_drawn_is_refused_at_enqueue(app: forklift.App) -> None:
    with pytest.raises(forklift.ArgumentError, match="its fair key raised AttributeError"):
        app.enqueue("report", {"tier": 5})


def test_the_limits_lookup_says_where_fair_jobs_wait(app: forklift.App) -> None:
    """limits_apply, the claimer's lookup of what applies (once a second), also says
    whether fair jobs wait in its queues: one due holding a turn, or one due without."""
    limits = LimitStore(app.store.pool, app.schema, "test")
    app.enqueue("plain", {}, queue="other")
    limits.apply(["default", "other"], [])
    assert not limits.fair_waiting
    app.enqueue("render", {"account": "a"}, delay=3600)  # due later: not yet
    limits.apply(["default", "other"], [])
    assert not limits.fair_waiting
    app.enqueue("render", {"account": "a"})
    limits.apply(["other", "default"], [])
    assert limits.fair_waiting


def test_jobs_show_says_the_fair_key_weight_and_turn(
    app: forklift.App, schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, second = app.enqueue_many([("report", {"tier": "gold", "n": i}) for i in range(2)])
    later = app.enqueue("report", {"tier": "free"}, delay=3600)
    admin = JobAdmin(app.dsn, schema)
    print_detail(admin.job_get(second))
    assert "  fair key     gold, weight 3, turn 0.333333\n" in capsys.readouterr().out
    print_detail(admin.job_get(later))
    assert "  fair key     free, no turn (due later: it joins the line as it falls due)\n" in (
        capsys.readouterr().out
    )
