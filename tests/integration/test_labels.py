"""Worker labels: a task's `requires=` stored on its jobs (migration 0025), the plain
claims leaving them alone, a labelled worker's claim taking them first
(job_claim_labelled), a job whose producer stored no labels given back with them, lost
ones taken back only by a worker with the labels, what `status`, `ps` and the queue
gauges say, and the declarations refused. The kills are in tests/faults/test_labels.py."""

from __future__ import annotations

import argparse
import json
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift._config import label_list
from forklift.admin import AdminStore, JobAdmin
from forklift.cli.observe import ps_json, ps_row
from forklift.shown.jobview import detail_json, print_detail
from forklift.shown.processes import listed
from forklift.store import claim_statement
from forklift.testing import wait_for
from forklift.workers import WorkerConfig
from tests.integration.conftest import RunWorker

Db = psycopg.Connection[Any]
OWNER = "test-host:1:labels"


@pytest.fixture
def ran() -> list[tuple[str, int]]:
    return []


@pytest.fixture
def app(dsn: str, schema: str, ran: list[tuple[str, int]]) -> Iterator[forklift.App]:
    a = forklift.App(dsn, schema=schema)
    lock = threading.Lock()

    def record(name: str, n: int) -> None:
        with lock:
            ran.append((name, n))

    @a.task(requires={"gpu"})
    def render(ctx: forklift.JobContext, *, n: int = 0) -> None:
        record("render", n)

    @a.task(requires=["model-x", "gpu"])
    def infer(ctx: forklift.JobContext, *, n: int = 0) -> None:
        record("infer", n)

    @a.task
    def plain(ctx: forklift.JobContext, *, n: int = 0) -> None:
        record("plain", n)

    a.migrate()
    yield a
    a.close()


def states(db: Db, schema: str, task: str) -> list[tuple[str, int]]:
    return [
        (r[0], r[1])
        for r in db.execute(
            f"SELECT state::text, attempts FROM {schema}.jobs WHERE task = %s ORDER BY id", (task,)
        )
    ]


def all_in(db: Db, schema: str, task: str, state: str) -> bool:
    return all(s == state for s, _ in states(db, schema, task))


def test_the_jobs_store_what_their_task_requires_sorted(app: forklift.App, db: Db) -> None:
    ids = [app.enqueue("infer"), app.enqueue("render"), app.enqueue("plain")]
    ids += app.enqueue_many([("infer", {"n": i}) for i in range(60)])[:1]  # by COPY
    rows = db.execute(
        f"SELECT requires FROM {app.schema}.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    assert [r[0] for r in rows] == ["gpu,model-x", "gpu", None, "gpu,model-x"]


def test_a_worker_without_the_labels_leaves_the_jobs_for_one_with_them(
    app: forklift.App, db: Db, run_worker: RunWorker, ran: list[tuple[str, int]]
) -> None:
    schema = app.schema
    app.enqueue_many([("render", {"n": i}) for i in range(10)])
    app.enqueue_many([("plain", {"n": i}) for i in range(10)])
    app.enqueue_many([("infer", {"n": i}) for i in range(5)])
    run_worker()  # no labels
    wait_for(lambda: all_in(db, schema, "plain", "succeeded"), timeout=20, what="plain done")
    gpu = run_worker(labels=("gpu",))  # "gpu" only: infer requires model-x too
    wait_for(lambda: all_in(db, schema, "render", "succeeded"), timeout=20, what="render done")
    assert states(db, schema, "infer") == [("ready", 0)] * 5  # nobody could take them
    gpu.request_stop(fast=True)
    run_worker(labels=("model-x", "gpu", "extra"))
    wait_for(lambda: all_in(db, schema, "infer", "succeeded"), timeout=20, what="infer done")
    assert all(a == 1 for _, a in states(db, schema, "render") + states(db, schema, "infer"))
    assert sorted(n for name, n in ran if name == "render") == list(range(10))


def test_a_labelled_worker_takes_the_jobs_only_it_can_run_first(
    app: forklift.App, db: Db, run_worker: RunWorker, ran: list[tuple[str, int]]
) -> None:
    app.enqueue_many([("plain", {"n": i}) for i in range(5)])
    app.enqueue_many([("render", {"n": i}) for i in range(5)])
    run_worker(labels=("gpu",))
    wait_for(lambda: len(ran) == 10, timeout=20, what="ten jobs run")
    assert [name for name, _ in ran] == ["render"] * 5 + ["plain"] * 5


def test_a_job_stored_without_its_labels_is_given_back_with_them_uncharged(
    app: forklift.App, dsn: str, db: Db, run_worker: RunWorker, ran: list[tuple[str, int]]
) -> None:
    """A producer that does not declare the task stores no labels: the first worker
    without them that claims the job gives it back, labels stored, attempt not spent."""
    producer = forklift.App(dsn, schema=app.schema)
    try:
        job_id = producer.enqueue("render", {"n": 7})
    finally:
        producer.close()
    run_worker()
    wait_for(
        lambda: (
            db.execute(
                f"SELECT requires FROM {app.schema}.jobs WHERE id = %s", (job_id,)
            ).fetchone()
            == ("gpu",)
        ),
        timeout=20,
        what="labels stored",
    )
    assert states(db, app.schema, "render") == [("ready", 0)] and ran == []
    run_worker(labels=("gpu",))
    wait_for(lambda: all_in(db, app.schema, "render", "succeeded"), timeout=20, what="run")
    assert states(db, app.schema, "render") == [("succeeded", 1)] and ran == [("render", 7)]


def test_a_lost_job_is_taken_back_only_by_a_worker_with_its_labels(
    app: forklift.App, db: Db
) -> None:
    job_id = app.enqueue("render")
    db.execute(  # running under an owner whose lease ran out and that no one vouches for
        f"UPDATE {app.schema}.jobs SET state = 'running', attempts = 1, seen_running = true,"
        " lease_owner = 'gone:1:x', lease_until = now() - interval '1 minute' WHERE id = %s",
        (job_id,),
    )

    def claim(*labels: str, queues: tuple[str, ...] = ("default",)) -> list[int]:
        made = app.store.job_claim_next((), queues, OWNER, 5, 30.0, expired=True, labels=labels)
        return [j.id for j in made.jobs]

    assert claim() == [] and claim(queues=("default", "other")) == []
    assert claim("model-x") == []
    assert claim("gpu") == [job_id]
    last_error = db.execute(
        f"SELECT last_error FROM {app.schema}.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert last_error is not None and "LeaseExpired" in last_error[0]


def test_paused_queues_keep_their_labelled_jobs(app: forklift.App) -> None:
    app.enqueue("render")
    AdminStore(app.dsn, app.schema).queue_pause("default", by="test")
    made = app.store.job_claim_next((), ["default"], OWNER, 5, 30.0, expired=False, labels=["gpu"])
    assert made.jobs == []


def register(db: Db, schema: str, pid: int, queues: list[str], labels: list[str]) -> None:
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, queues, labels)"
        " VALUES (%s, 'worker', 'host-a', %s, %s, %s)",
        (f"host-a:{pid}:w", pid, queues, labels),
    )


def test_status_and_the_gauges_count_the_jobs_no_registered_worker_can_take(
    app: forklift.App, db: Db
) -> None:
    admin = AdminStore(app.dsn, app.schema)
    app.enqueue_many([("render", {"n": i}) for i in range(3)])
    app.enqueue_many([("infer", {"n": i}) for i in range(2)])
    app.enqueue("plain")

    def unrunnable() -> dict[str, int]:
        return {s.queue: s.unrunnable for s in admin.queue_stats(throughput=False)}

    assert unrunnable() == {"default": 5}
    register(db, app.schema, 1, ["other"], ["gpu", "model-x"])  # another queue's worker
    assert unrunnable() == {"default": 5}
    register(db, app.schema, 2, ["default"], ["gpu"])
    assert unrunnable() == {"default": 2}  # infer needs model-x too
    register(db, app.schema, 3, ["default", "other"], ["gpu", "model-x"])
    assert unrunnable() == {"default": 0}


def test_ps_shows_each_workers_labels(app: forklift.App, db: Db) -> None:
    admin = AdminStore(app.dsn, app.schema)
    register(db, app.schema, 4, ["default"], ["gpu", "model-x"])
    register(db, app.schema, 5, ["default"], [])
    lines = {line.pid: line for line in listed(admin.process_list(), [])}
    assert ps_row(lines[4], set())[3] == "default [gpu,model-x]"
    assert ps_row(lines[5], set())[3] == "default"
    assert ps_json(lines[4], set())["labels"] == ["gpu", "model-x"]


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"requires": "gpu"}, "a set of names"),
        ({"requires": {"gpu,x"}}, "comma"),
        ({"requires": {""}}, "must not be empty"),
        ({"requires": {"gpu"}, "limit": forklift.Limit(concurrency=1)}, "limit="),
        ({"requires": {"gpu"}, "fair": "n"}, "fair="),
    ],
)
def test_bad_requirements_are_refused_at_declaration(
    dsn: str, schema: str, options: dict[str, Any], says: str
) -> None:
    a = forklift.App(dsn, schema=schema)
    with pytest.raises(forklift.ConfigError, match=says):

        @a.task(**options)
        def t(ctx: forklift.JobContext, *, n: int = 0) -> None: ...


def test_bad_labels_are_refused_by_the_worker_and_the_flag() -> None:
    with pytest.raises(forklift.ConfigError, match="comma"):
        WorkerConfig(labels=("a,b",))
    with pytest.raises(forklift.ConfigError, match="at most 10"):
        WorkerConfig(labels=tuple(f"l{i}" for i in range(11)))
    assert WorkerConfig(labels=("b", "a", "b")).labels == ("a", "b")
    assert label_list(" gpu, model-x ,gpu") == ("gpu", "model-x")
    assert label_list("") == ()
    with pytest.raises(argparse.ArgumentTypeError, match="control character"):
        label_list("gpu,\x1b[31m")


def test_jobs_show_says_what_labels_a_job_requires(
    app: forklift.App, capsys: pytest.CaptureFixture[str]
) -> None:
    needy, plain = app.enqueue("infer"), app.enqueue("plain")
    admin = JobAdmin(app.dsn, app.schema)
    print_detail(admin.job_get(needy))
    assert "  requires     gpu, model-x (forklift run --labels)\n" in capsys.readouterr().out
    print_detail(admin.job_get(plain))
    assert "requires" not in capsys.readouterr().out
    assert detail_json(admin.job_get(needy))["requires"] == ["gpu", "model-x"]
    assert detail_json(admin.job_get(plain))["requires"] is None


def _nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from _nodes(child)


def read_past(db: Db, sql: str, params: dict[str, Any]) -> dict[str, int]:
    """Each index a claim read (none: a sequential scan, `seq`), and the rows it read
    past (its filter's), by EXPLAIN ANALYZE in a transaction rolled back."""
    with db.transaction(force_rollback=True):
        row = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    plan = row[0] if isinstance(row[0], list) else json.loads(row[0])
    scans: dict[str, int] = {}
    for n in _nodes(plan[0]["Plan"]):
        seq = n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs"
        if seq or "Index Name" in n:
            name = "seq" if seq else n["Index Name"]
            scans[name] = scans.get(name, 0) + int(n.get("Rows Removed by Filter", 0))
    return scans


@pytest.mark.parametrize("limit", [1, 128])
def test_no_claim_reads_past_a_backlog_of_jobs_that_require_other_labels(
    app: forklift.App, db: Db, limit: int
) -> None:
    """2,000 jobs wait for gpu,model-x: the claims of a worker without labels (one queue,
    several, the expiry scan's) and the labelled claim of a gpu-only worker read none of
    them; a gpu,model-x worker's reads them in its index's order. (bench.labels phase 3
    measures the drains: before the index by labels and jobs_ready_unlabelled_idx, the
    claim of several queues read 200,000 entries a claim past 100,000 such jobs, and the
    labelled claim's plan turned to a scan of the table at 64 jobs a claim.)"""
    app.enqueue_many([("infer", {"n": i}) for i in range(2000)])
    app.enqueue_many([("plain", {"n": i}) for i in range(5)] + [("render", {})] * 5)
    db.execute(f"ANALYZE {app.schema}.jobs")
    claims = {
        "one queue": ((), ["default"], False),
        "two queues": ((), ["default", "other"], False),
        "expiry": ((), ["default"], True),
        "gpu": (("gpu",), ["default"], True),
        "gpu,model-x": (("gpu", "model-x"), ["default"], False),
    }
    read = {}
    for name, (labels, queues, expired) in claims.items():
        sql, params = claim_statement(
            app.store.q, queues, OWNER, limit, 30.0, expired, (), None, labels=labels
        )
        read[name] = read_past(db, sql, params)
    assert all("seq" not in scans for scans in read.values()), read
    assert all(sum(scans.values()) == 0 for scans in read.values()), read
    assert "jobs_ready_labelled_idx" in read["gpu,model-x"], read
