"""The operator's job store on a real PostgreSQL: index use, pages, retry, cancel, purge, pause."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db, _sql
from forklift.admin import AdminStore, JobAdmin
from forklift.admin.batches import BatchAdmin
from forklift.admin.rows import JobFilter
from forklift.cli import jobs as jobs_cli
from forklift.dashboard import views
from forklift.shown import jobview
from forklift.store import JobStore
from forklift.testing import wait_for
from tests.integration.conftest import RunWorker

Conn = psycopg.Connection[Any]

# A resumable job's checkpoint, as its worker would have written it (migration 0018).
CHECKPOINT = (
    '{"v": 1, "cursors": {"iterate": 41}, "steps": {"download": "x", "unpack": [1]},'
    ' "state": {"page": 3, "api_token": "hunter2"}, "ran": 95.5}'
)


@pytest.fixture
def producer(dsn: str, schema: str) -> Iterator[forklift.App]:
    app = forklift.App(dsn, schema=schema)
    yield app
    app.close()


@pytest.fixture
def admin(dsn: str, schema: str) -> JobAdmin:
    return JobAdmin(dsn, schema)


def _fill(db: Conn, schema: str) -> None:
    """A table as a busy queue leaves it: mostly succeeded, some dead, a ready backlog."""
    db.execute(
        f"""INSERT INTO {schema}.jobs (queue, task, state, completed_at, last_error, lease_owner)
        SELECT 'q' || (i % 5), 't' || (i % 7), s.state::{schema}.job_state,
               CASE WHEN s.state IN ('succeeded', 'dead', 'cancelled') THEN now() END,
               CASE WHEN s.state = 'dead' THEN 'RuntimeError: boom ' || i END,
               CASE WHEN s.state = 'running' THEN 'w:1:x' END
        FROM generate_series(1, 100000) AS i,
        LATERAL (SELECT CASE WHEN i <= 95000 THEN 'succeeded' WHEN i <= 96000 THEN 'dead'
                 WHEN i <= 96100 THEN 'cancelled' WHEN i <= 96110 THEN 'running'
                 ELSE 'ready' END AS state) AS s"""
    )
    db.execute(f"ANALYZE {schema}.jobs")


def test_every_filter_combination_of_a_list_reads_through_an_index(db: Conn, schema: str) -> None:
    _fill(db, schema)
    q = _sql.load("forklift.admin", "jobs.sql", schema)
    combinations = itertools.product(
        [None, "ready", "scheduled", "running", "succeeded", "dead", "cancelled"],
        [None, "q1"],
        [None, "t2"],
        [None, "%boom%"],
        [None, 50_000],
    )
    for state, queue, task, error, before in combinations:
        scheduled = state == "scheduled"  # as JobAdmin.job_list passes it
        params = dict(
            state="ready" if scheduled else state, scheduled=scheduled, queue=queue, task=task,
            error=error, before=before,
        )  # fmt: skip
        params.update(window=50_000, limit=50)
        for name in ("job_list", "job_list_window"):
            plan = "\n".join(r[0] for r in db.execute("EXPLAIN " + q[name], params))
            assert "Seq Scan" not in plan, (name, params, plan)
            assert "Index" in plan, (name, params, plan)


def _jobs(producer: forklift.App, n: int, **options: Any) -> list[int]:
    return [producer.enqueue("noop", **options) for _ in range(n)]


def test_pages_run_newest_first_and_say_where_the_next_one_starts(
    producer: forklift.App, admin: JobAdmin
) -> None:
    ids = _jobs(producer, 5) + _jobs(producer, 2, queue="other")
    page = admin.job_list(JobFilter(), limit=3, before=None)
    assert [j.id for j in page.jobs] == ids[::-1][:3] and page.next_before == ids[4]
    page = admin.job_list(JobFilter(queue="default"), limit=10, before=page.next_before)
    assert [j.id for j in page.jobs] == ids[3::-1] and page.next_before is None
    page = admin.job_list(JobFilter(queue="other"), limit=2, before=None)  # exactly full
    assert [j.id for j in page.jobs] == ids[:4:-1] and page.next_before is None
    # A window smaller than the table: a short page says where older matches may be.
    page = admin.job_list(JobFilter(queue="default"), limit=10, before=None, window=3)
    assert [j.id for j in page.jobs] == [ids[4]] and page.next_before == ids[4]


def test_scheduled_jobs_are_the_ready_ones_due_later(
    producer: forklift.App, admin: JobAdmin
) -> None:
    due = _jobs(producer, 2)
    later = _jobs(producer, 2, delay=3600) + _jobs(producer, 1, delay=60, queue="other")
    page = admin.job_list(JobFilter(state="scheduled"), limit=10, before=None)
    assert [j.id for j in page.jobs] == later[::-1] and page.next_before is None
    page = admin.job_list(JobFilter(state="scheduled", queue="other"), limit=10, before=None)
    assert [j.id for j in page.jobs] == later[2:]
    page = admin.job_list(JobFilter(state="ready"), limit=10, before=None)  # due or not
    assert [j.id for j in page.jobs] == (due + later)[::-1]
    page = admin.job_list(JobFilter(state="scheduled"), limit=2, before=None)
    assert [j.id for j in page.jobs] == later[:0:-1] and page.next_before == later[1]


def test_the_error_filter_takes_its_text_literally(
    db: Conn, schema: str, producer: forklift.App, admin: JobAdmin
) -> None:
    plain, percent = _jobs(producer, 2)
    db.execute(f"UPDATE {schema}.jobs SET last_error = 'Disk 100%% full' WHERE id = %s", (percent,))
    db.execute(f"UPDATE {schema}.jobs SET last_error = 'Disk 100 full' WHERE id = %s", (plain,))
    found = admin.job_list(JobFilter(error="100% FULL"), limit=10, before=None).jobs
    assert [j.id for j in found] == [percent]


def test_retry_resets_the_budgets_and_notes_it_and_wakes_the_queue(
    dsn: str, db: Conn, schema: str, producer: forklift.App, admin: JobAdmin
) -> None:
    dead, running = _jobs(producer, 2, queue="mail")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', attempts = 5, crashes = 1,"
        " completed_at = now() WHERE id = %s",
        (dead,),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', lease_owner = 'w:1:x' WHERE id = %s",
        (running,),
    )
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{schema}_jobs"')
        acted = admin.job_retry_many([running, dead, 999_999])
        heard = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert heard == ["mail"]
    assert [(a.id, a.done, a.was, a.attempts, a.crashes) for a in acted] == [
        (dead, True, "dead", 5, 1), (running, False, "running", 0, 0), (999_999, False, None, 0, 0),
    ]  # fmt: skip
    detail = admin.job_get(dead)
    assert (detail.job.state, detail.job.attempts, detail.job.crashes) == ("ready", 0, 0)
    assert detail.job.completed_at is None
    assert detail.errors[-1]["error"].startswith("Retried by ")
    assert "attempts 5 and crashes 1 reset to 0" in detail.errors[-1]["error"]


def test_all_dead_is_found_in_batches_of_a_queue_and_task(
    db: Conn, schema: str, producer: forklift.App, admin: JobAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("forklift.admin.jobs.BATCH", 2)
    mine = _jobs(producer, 5, queue="mail")
    other = _jobs(producer, 1)
    db.execute(f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now()")
    assert list(admin.job_dead_ids("mail", None)) == [mine[:2], mine[2:4], mine[4:]]
    assert list(admin.job_dead_ids(None, "noop"))[-1] == [mine[4], *other]


def test_cancel_takes_a_running_jobs_lease_and_tells_its_worker(
    dsn: str, db: Conn, schema: str, producer: forklift.App, admin: JobAdmin
) -> None:
    ready, running, done = _jobs(producer, 3)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 2, lease_owner = 'w:1:x',"
        " lease_until = now() + interval '1 minute' WHERE id = %s",
        (running,),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() WHERE id = %s",
        (done,),
    )
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{_sql.control_channel_name(schema)}"')
        acted = admin.job_cancel_many([done, running, ready])
        heard = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
    assert heard == [f"cancel {running} 2"]
    assert [(a.id, a.done, a.was, a.owner) for a in acted] == [
        (ready, True, "ready", None), (running, True, "running", "w:1:x"),
        (done, False, "succeeded", None),
    ]  # fmt: skip
    job = admin.job_get(running)
    assert (job.job.state, job.job.lease_owner, job.lease_until) == ("cancelled", None, None)
    assert job.errors[-1]["worker"] == "w:1:x"
    assert job.errors[-1]["error"].endswith("while it ran")
    # Its worker's completion is refused by the owner fence: nothing it does commits.
    store = JobStore(_db.make_pool(dsn, _db.Timeouts(), max_size=1, name="t"), schema)
    store.pool.open()
    try:
        assert store.job_complete_many([(running, 2, None, None)], "w:1:x") == set()
    finally:
        store.pool.close()


def test_purge_deletes_old_finished_jobs_of_one_state_in_batches(
    db: Conn, schema: str, producer: forklift.App, admin: JobAdmin, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("forklift.admin.jobs.BATCH", 2)
    old = _jobs(producer, 5)
    fresh, alive = _jobs(producer, 2)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now() - interval '8 days'"
        " WHERE id = ANY(%s)",
        (old,),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now() WHERE id = %s", (fresh,)
    )
    seven_days = 7 * 86400.0
    counted = admin.job_purge("dead", seven_days, dry_run=True)
    assert (counted.jobs, counted.batches) == (5, 0)
    purged = admin.job_purge("dead", seven_days, dry_run=False)
    assert (purged.jobs, purged.batches) == (5, 3)
    left = {r[0] for r in db.execute(f"SELECT id FROM {schema}.jobs")}
    assert left == {fresh, alive}
    assert admin.job_purge("succeeded", 0.0, dry_run=False).jobs == 0


def test_a_paused_queue_is_skipped_by_the_claim_and_resuming_wakes_it(
    dsn: str, schema: str, producer: forklift.App
) -> None:
    paused_job = producer.enqueue("noop", queue="mail")
    open_job = producer.enqueue("noop", queue="default")
    stats = AdminStore(dsn, schema)
    assert stats.queue_pause("mail") is True and stats.queue_pause("mail") is False
    assert {s.queue: s.paused for s in stats.queue_stats()} == {"default": False, "mail": True}
    store = JobStore(_db.make_pool(dsn, _db.Timeouts(), max_size=1, name="t"), schema)
    store.pool.open()
    try:
        claimed = store.job_claim(["mail", "default"], "w:1:x", 10, 30.0, expired=True)
        assert [j.id for j in claimed] == [open_job]
        assert store.job_next_available(["mail"]) is None  # an idle worker does not spin
        with psycopg.connect(dsn, autocommit=True) as listener:
            listener.execute(f'LISTEN "{schema}_jobs"')
            assert stats.queue_resume("mail") is True
            heard = [n.payload for n in listener.notifies(timeout=2.0, stop_after=1)]
        assert heard == ["mail"] and stats.queue_resume("mail") is False
        claimed = store.job_claim(["mail", "default"], "w:1:x", 10, 30.0, expired=True)
        assert [j.id for j in claimed] == [paused_job]
    finally:
        store.pool.close()


def test_a_finished_job_says_which_worker_ran_it(
    app: forklift.App,
    run_worker: RunWorker,
    admin: JobAdmin,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`jobs show` and the dashboard said `worker -` for every succeeded job."""
    worker = run_worker()
    plain = app.enqueue("noop")  # completed by the plain group commit
    valued = app.enqueue("square", {"n": 3})  # by the one that writes results
    failed = app.enqueue("give_up")  # dead: its history names the worker
    for job_id in (plain, valued, failed):
        wait_for(
            lambda: admin.job_get(job_id).job.state in ("succeeded", "dead"),  # noqa: B023
            timeout=20,
            what=f"job {job_id} finished",
        )
    for job_id in (plain, valued, failed):
        detail = admin.job_get(job_id)
        assert jobview.worker(detail) == worker.owner, (job_id, detail)
        assert jobview.detail_json(detail)["worker"] == worker.owner
        jobview.print_detail(detail)
        shown = capsys.readouterr().out
        assert f"  worker       {worker.owner}\n" in shown, shown
        assert dict(views.job_view(detail).fields)["worker"] == worker.owner


def _checkpointed(db: Conn, schema: str, ids: list[int], state: str = "dead") -> None:
    """Jobs gone to `state` with a checkpoint written 12 s ago."""
    db.execute(
        f"UPDATE {schema}.jobs SET state = %s::{schema}.job_state, checkpoint = %s::jsonb,"
        " checkpoint_at = now() - interval '12 seconds',"
        " completed_at = CASE WHEN %s IN ('dead', 'cancelled') THEN now() END,"
        " lease_owner = CASE WHEN %s = 'running' THEN 'w:1:x' END,"
        " started_at = CASE WHEN %s = 'running' THEN now() END"
        " WHERE id = ANY(%s)",
        (state, CHECKPOINT, state, state, state, ids),
    )


def _checkpoints(db: Conn, schema: str, ids: list[int]) -> list[tuple[bool, bool]]:
    """Whether each job (in id order) has a checkpoint, and a time it was written."""
    rows = db.execute(
        f"SELECT checkpoint IS NOT NULL, checkpoint_at IS NOT NULL FROM {schema}.jobs"
        " WHERE id = ANY(%s) ORDER BY id",
        (ids,),
    )
    return [(bool(a), bool(b)) for a, b in rows]


def test_a_checkpoint_is_shown_with_its_age_cursors_steps_and_state_secrets_hidden(
    db: Conn, schema: str, producer: forklift.App, admin: JobAdmin
) -> None:
    job, plain = _jobs(producer, 2)
    _checkpointed(db, schema, [job])
    detail = admin.job_get(job)
    checkpoint = detail.checkpoint
    assert checkpoint is not None and checkpoint.at is not None
    assert 11 <= (detail.now - checkpoint.at).total_seconds() < 60
    assert (checkpoint.version, checkpoint.cursors, checkpoint.steps, checkpoint.ran) == (
        1, {"iterate": 41}, ["download", "unpack"], 95.5,
    )  # fmt: skip
    assert admin.job_get(plain).checkpoint is None

    shown = jobs_cli.checkpoint_json(checkpoint)
    assert shown["checkpoint"]["state"] == {"page": 3, "api_token": "***"}
    assert shown["checkpoint"]["steps"] == {"download": "x", "unpack": [1]}  # whole
    assert shown["checkpoint_at"].endswith("Z")
    assert datetime.fromisoformat(shown["checkpoint_at"]) == checkpoint.at
    assert jobs_cli.checkpoint_json(None) == {"checkpoint": None, "checkpoint_at": None}
    head, cursors, steps, state = jobs_cli.checkpoint_lines(checkpoint, detail.now)
    assert head.startswith("checkpoint: written ") and "(12s ago), version 1, 96s of work" in head
    assert cursors == '  cursors      {"iterate": 41}'
    assert steps == "  steps done   download, unpack"
    assert state == '  state        {"page": 3, "api_token": "***"}'
    long_state = {"text": "x" * 500}
    assert len(jobs_cli.compact(long_state)) == jobs_cli.CHECKPOINT_CHARS
    assert jobs_cli.compact(long_state).endswith("…")

    fields = dict(views.job_view(detail).fields)
    assert fields["checkpoint"].endswith("(12s ago), version 1, 96s of work")
    assert (fields["cursors"], fields["steps done"]) == ('{"iterate": 41}', "download, unpack")
    assert fields["checkpoint state"] == '{"page": 3, "api_token": "***"}'
    assert views.job_view(detail).resumable and not views.job_view(admin.job_get(plain)).resumable
    assert "checkpoint" not in dict(views.job_view(admin.job_get(plain)).fields)


def test_retry_keeps_the_checkpoint_and_from_scratch_clears_it(
    db: Conn, schema: str, producer: forklift.App, admin: JobAdmin
) -> None:
    kept, cleared, bare = _jobs(producer, 3)
    _checkpointed(db, schema, [kept, cleared])
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now() WHERE id = %s", (bare,)
    )
    [acted] = admin.job_retry_many([kept])
    assert (acted.done, acted.checkpoint) == (True, "kept")
    assert acted.checkpoint_note == ", resumes from its checkpoint"
    acted_many = admin.job_retry_many([cleared, bare], from_scratch=True)
    assert [(a.id, a.done, a.checkpoint) for a in acted_many] == [
        (cleared, True, "cleared"), (bare, True, None),
    ]  # fmt: skip
    assert acted_many[0].checkpoint_note == ", checkpoint cleared: starts from scratch"
    assert acted_many[1].checkpoint_note == ""
    assert _checkpoints(db, schema, [kept, cleared, bare]) == [
        (True, True), (False, False), (False, False),
    ]  # fmt: skip
    assert admin.job_get(kept).job.state == "ready"
    assert (
        admin.job_get(kept).errors[-1]["error"].endswith("reset to 0, resumes from its checkpoint")
    )
    assert admin.job_get(cleared).errors[-1]["error"].endswith("reset to 0, checkpoint cleared")
    assert admin.job_get(bare).errors[-1]["error"].endswith("crashes 0 reset to 0")
    # A job not retried (it is ready now) keeps its checkpoint, even from scratch.
    [again] = admin.job_retry_many([kept], from_scratch=True)
    assert (again.done, again.checkpoint) == (False, None)
    assert _checkpoints(db, schema, [kept]) == [(True, True)]


def test_an_operators_cancel_clears_the_checkpoints_of_the_jobs_it_cancels(
    dsn: str, db: Conn, schema: str, producer: forklift.App, admin: JobAdmin
) -> None:
    ready, running, dead = _jobs(producer, 3)
    _checkpointed(db, schema, [ready], "ready")
    _checkpointed(db, schema, [running], "running")
    _checkpointed(db, schema, [dead])
    [row] = [r for r in admin.job_running_list() if r.id == running]
    assert row.checkpoint_age is not None and 11 <= row.checkpoint_age < 60
    acted = admin.job_cancel_many([ready, running, dead])
    assert [(a.id, a.done) for a in acted] == [(ready, True), (running, True), (dead, False)]
    # Cancelled: nothing to resume. Dead, not cancelled: a retry still resumes it.
    assert _checkpoints(db, schema, [ready, running, dead]) == [
        (False, False), (False, False), (True, True),
    ]  # fmt: skip
    # A batch's cancel cancels its jobs as `jobs cancel` does: their checkpoints go too.
    batch = producer.enqueue_batch([("noop", {}), ("noop", {})])
    in_batch = [
        r[0] for r in db.execute(f"SELECT id FROM {schema}.jobs WHERE batch_id = %s", (batch.id,))
    ]
    _checkpointed(db, schema, in_batch, "ready")
    gone = BatchAdmin(dsn, schema).batch_cancel(batch.id)
    assert sorted(j.id for j in gone.jobs if j.done) == sorted(in_batch)
    assert _checkpoints(db, schema, in_batch) == [(False, False), (False, False)]
