"""The worker loop against a real PostgreSQL: every state transition and its fence."""

from __future__ import annotations

import functools
import time
from typing import Any

import psycopg
import pytest

import forklift
from forklift.store import Claim
from forklift.testing import wait_for
from forklift.workers import Worker
from forklift.workers.maintenance import Maintained
from tests.integration.conftest import RunWorker


def listening(db: psycopg.Connection[Any], schema: str) -> bool:
    """Whether a worker of `schema` listens for its jobs (another test's, on the same
    server at the same time, does not count)."""
    row = db.execute(
        "SELECT count(*) >= 1 FROM pg_stat_activity"
        " WHERE application_name = 'forklift-listener' AND query LIKE %s",
        (f'LISTEN "{schema}_%',),
    ).fetchone()
    return bool(row and row[0])


def job(db: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any]:
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    row = cur.execute(f"SELECT * FROM {schema}.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return row


def state_is(db: psycopg.Connection[Any], schema: str, job_id: int, state: str) -> bool:
    return bool(job(db, schema, job_id)["state"] == state)


def succeeded(db: psycopg.Connection[Any], schema: str) -> int:
    row = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'").fetchone()
    return 0 if row is None else int(row[0])


def effects(db: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT job_id, key, n FROM {schema}.effects ORDER BY job_id").fetchall()


def test_success_commits_effect_and_completion_together(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("effect", {"key": "a", "n": 7})
    run_worker()
    wait_for(lambda: state_is(db, schema, job_id, "succeeded"), what="job succeeded")
    row = job(db, schema, job_id)
    assert row["attempts"] == 1
    assert row["lease_owner"] is None and row["lease_until"] is None
    assert row["started_at"] is not None and row["completed_at"] is not None
    assert effects(db, schema) == [(job_id, "a", 7)]


def test_noop_jobs_are_group_committed(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    ids = app.enqueue_many([("noop", {}) for _ in range(500)])
    run_worker(concurrency=16)
    wait_for(lambda: succeeded(db, schema) == len(ids), what="all noop jobs succeeded")


def test_failure_retries_with_backoff_then_dead(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("fail", {"message": "bad thing"})
    run_worker()
    wait_for(lambda: state_is(db, schema, job_id, "dead"), what="job dead")
    row = job(db, schema, job_id)
    assert row["attempts"] == 3  # the task's max_attempts
    assert row["last_error"] == "RuntimeError: bad thing"
    history = row["errors"]
    assert [e["attempt"] for e in history] == [1, 2, 3]
    assert all(e["error"] == "RuntimeError: bad thing" for e in history)
    assert all("Traceback" in e["traceback"] and e["worker"] for e in history)
    assert row["completed_at"] is not None and row["lease_owner"] is None


def test_retry_waits_its_backoff(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("retry_later", {"retry_in": 1.5})
    run_worker()
    wait_for(
        lambda: job(db, schema, job_id)["attempts"] == 1 and state_is(db, schema, job_id, "ready"),
        what="first attempt failed",
    )
    first = job(db, schema, job_id)
    wait_for(lambda: state_is(db, schema, job_id, "dead"), what="second attempt dead")
    second = job(db, schema, job_id)
    # The retry became available 1.5 s after the failure and did not start before that.
    waited = (first["available_at"] - first["started_at"]).total_seconds()
    assert 1.4 <= waited <= 2.5
    assert second["started_at"] >= first["available_at"]
    assert second["last_error"] == "Retry: try again"


def test_a_retry_starts_when_due_after_the_claims_drained_the_queue(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """The worker's claims left slots free (the queue drained), and it hears no NOTIFY
    (as behind a transaction pooler); a job that fails puts its retry in line, and the
    loop looks up its due time again rather than sleeping its poll interval (a minute)."""
    job_id = app.enqueue("retry_after", {"run": 0.3, "retry_in": 0.5})
    run_worker(poll_interval=60.0, concurrency=2, listen=False)  # its first claim takes it
    wait_for(lambda: state_is(db, schema, job_id, "dead"), timeout=10, what="second attempt")
    row = job(db, schema, job_id)
    assert row["attempts"] == 2
    # (the first attempt's available_at is gone: the second started soon after its due)
    assert (row["started_at"] - row["created_at"]).total_seconds() < 2.0


def test_fail_goes_dead_at_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("give_up")
    run_worker()
    wait_for(lambda: state_is(db, schema, job_id, "dead"), what="job dead")
    row = job(db, schema, job_id)
    assert row["attempts"] == 1
    assert row["last_error"] == "Fail: not worth retrying"


def test_an_unknown_task_retries_with_backoff_then_ends_dead_naming_the_worker(
    dsn: str, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    # A producer that knows a task no worker has deployed yet (a rolling deploy).
    producer = forklift.App(dsn, schema=schema)
    unknown = producer.enqueue("no_such_task", {"x": 1}, max_attempts=2)
    producer.close()
    worker = run_worker()
    wait_for(
        lambda: (j := job(db, schema, unknown))["attempts"] == 1 and j["state"] == "ready",
        what="first attempt recorded",
    )
    first = job(db, schema, unknown)
    assert first["state"] == "ready"  # not dead on the first try: it retries
    assert first["last_error"] == (
        f"UnknownTaskError: no task named 'no_such_task' in worker {worker.owner}"
    )
    retry_in = db.execute(
        f"SELECT extract(epoch FROM available_at - now()) FROM {schema}.jobs WHERE id = %s",
        (unknown,),
    ).fetchone()
    assert retry_in is not None and 0.3 < retry_in[0] <= 1.2  # Backoff(): 1 s +- 20 %
    wait_for(lambda: state_is(db, schema, unknown, "dead"), timeout=10, what="dead at max")
    assert job(db, schema, unknown)["attempts"] == 2


def test_bad_arguments_end_dead_at_once_with_a_clear_error(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    # Enqueued under a name the producer does not check (as another service would).
    with app.store.pool.connection() as conn:
        bad = conn.execute(
            f"INSERT INTO {schema}.jobs (task, args) VALUES ('effect', '{{\"nope\": 1}}')"
            " RETURNING id"
        ).fetchone()[0]  # type: ignore[index]
    run_worker()
    wait_for(lambda: state_is(db, schema, bad, "dead"), what="bad args dead")
    assert job(db, schema, bad)["attempts"] == 1
    bad_error = job(db, schema, bad)["last_error"]
    assert bad_error.startswith("ArgumentError: effect:")
    assert "key" in bad_error or "nope" in bad_error


def test_handler_exception_in_effect_rolls_back_effect(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    @app.task(name="effect_then_fail", max_attempts=1)
    def effect_then_fail(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(
                f"INSERT INTO {schema}.effects (job_id, key) VALUES (%s, 'x')", (ctx.job_id,)
            )
        raise ValueError("after the effect")

    try:
        job_id = app.enqueue("effect_then_fail")
        run_worker()
        wait_for(lambda: state_is(db, schema, job_id, "dead"), what="job dead")
        assert effects(db, schema) == []
        assert job(db, schema, job_id)["last_error"] == "ValueError: after the effect"
    finally:
        del app.tasks["effect_then_fail"]


def test_effect_commit_failure_fails_the_attempt_with_its_error(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    db.execute(f"CREATE TABLE {schema}.parents (id integer PRIMARY KEY)")
    db.execute(
        f"CREATE TABLE {schema}.children (parent integer REFERENCES {schema}.parents"
        " DEFERRABLE INITIALLY DEFERRED)"
    )

    @app.task(name="orphan", max_attempts=1)
    def orphan(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as conn:
            conn.execute(
                f"INSERT INTO {schema}.effects (job_id, key) VALUES (%s, 'x')", (ctx.job_id,)
            )
            conn.execute(f"INSERT INTO {schema}.children VALUES (1)")  # checked at COMMIT

    try:
        job_id = app.enqueue("orphan")
        run_worker()
        wait_for(lambda: state_is(db, schema, job_id, "dead"), what="job dead")
        row = job(db, schema, job_id)
        assert row["attempts"] == 1
        assert "ForeignKeyViolation" in row["last_error"]
        assert "ForeignKeyViolation" in row["errors"][0]["traceback"]
        assert effects(db, schema) == []
    finally:
        del app.tasks["orphan"]


def test_delayed_job_starts_on_time(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    # poll_interval far away: only the next-due computation can start it on time.
    run_worker(poll_interval=30.0).idle.wait()  # idle: it sleeps until woken or due
    job_id = app.enqueue("noop", delay=1.0)
    wait_for(lambda: state_is(db, schema, job_id, "succeeded"), timeout=5, what="delayed job")
    row = job(db, schema, job_id)
    late = (row["started_at"] - row["available_at"]).total_seconds()
    assert 0 <= late < 0.5
    assert (row["available_at"] - row["created_at"]).total_seconds() >= 0.99


def test_notify_wakes_an_idle_worker(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    worker = run_worker(poll_interval=60.0)  # no polling to speak of: only NOTIFY can wake it
    wait_for(lambda: listening(db, schema), what="listener connected")
    worker.idle.wait()  # asleep now, for a minute unless a notification comes
    job_id = app.enqueue("noop")
    wait_for(lambda: state_is(db, schema, job_id, "succeeded"), timeout=3, what="woken by NOTIFY")
    row = job(db, schema, job_id)
    assert (row["started_at"] - row["created_at"]).total_seconds() < 1.0


def recorded_claims(worker: Worker, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Every claim the worker makes from now on: (jobs asked for, completions carried)."""
    calls: list[tuple[int, int]] = []
    claim = worker.claimer.claim

    def recorded(free: int, **kwargs: Any) -> Claim:
        calls.append((free, len(kwargs.get("complete") or ())))
        return claim(free, **kwargs)

    monkeypatch.setattr(worker.claimer, "claim", recorded)
    return calls


def test_a_worker_whose_claim_drained_the_queue_does_not_claim_again_as_jobs_end(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its last claim took fewer jobs than it had slots for: a slot freeing is no news
    (a new job notifies). Claiming anyway after every job found nothing, and the next
    job's notification, coming mid-claim, found it blind until that claim returned."""
    worker = run_worker(poll_interval=60.0, concurrency=2)
    wait_for(lambda: listening(db, schema), what="listener connected")

    def run_one() -> None:
        job_id = app.enqueue("noop")  # claimed alone: fewer than its 2 slots
        wait_for(lambda: state_is(db, schema, job_id, "succeeded"), timeout=5, what="the job")

    run_one()  # (whatever woke it while it connected has been looked at by now)
    claims = recorded_claims(worker, monkeypatch)
    for _ in range(4):
        run_one()
    assert len(claims) == 4, claims  # one a job: none when a job ended


def test_a_claim_that_carries_completions_claims_the_room_they_leave(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Successes waiting for group commit ride the next claim and are written in its
    transaction, so they must not shrink it: counted as held, a worker draining tiny
    jobs alternated a full claim with one of a few jobs that carried the last one's
    completions, paying a claim statement for next to nothing."""
    worker = run_worker(poll_interval=60.0)
    calls = recorded_claims(worker, monkeypatch)
    app.enqueue_many([("noop", {})] * 3000)  # its NOTIFY wakes the idle worker
    wait_for(lambda: succeeded(db, schema) == 3000, timeout=60, what="drain")
    carrying = [(asked, carried) for asked, carried in calls if carried >= 32]
    assert carrying, calls  # the drain did group its completions into claims
    assert [c for c in carrying if c[0] < c[1] // 2] == [], calls


def test_a_claim_with_no_slot_busy_goes_ahead_of_the_successes_it_would_carry(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Jobs too long to be claimed ahead, one slot: every claim is made with nothing
    running, and the next job waits on it. It does not carry the last job's success
    (its completion would run first in its transaction): the completer writes that
    right after it. (Prefetch off: on a loaded machine a claim slower than 12.5 ms makes
    50 ms jobs worth claiming one ahead, and a claim ahead rightly carries.)"""
    worker = run_worker(poll_interval=60.0, concurrency=1, prefetch=False)
    worker.idle.wait()
    calls = recorded_claims(worker, monkeypatch)
    ids = [app.enqueue("sleep", {"seconds": 0.05}) for _ in range(4)]
    wait_for(lambda: succeeded(db, schema) == 4, timeout=30, what="jobs")
    assert len(calls) >= 4, calls  # one claim per job at least
    assert [carried for _, carried in calls] == [0] * len(calls), calls
    assert all(job(db, schema, i)["attempts"] == 1 for i in ids)


def test_a_stop_during_a_claim_gone_ahead_still_writes_the_success_it_held_back(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The stop comes while a claim that went ahead of the last job's success is on its
    way: the claimed job goes back, and the success is written at once, not left held
    back while the drain waits out its grace for it. (Prefetch off, as above: the claim
    must be one that nothing runs beside.)"""
    worker = run_worker(poll_interval=60.0, concurrency=1, grace=60.0, prefetch=False)
    worker.idle.wait()
    claim = worker.claimer.claim
    stopped: list[int] = []

    def stopping_while_a_success_is_held_back(free: int, **kwargs: Any) -> Claim:
        # One job held and no slot busy: its handler returned, its success not written.
        if not stopped and len(worker.holdings) == 1 and worker.holdings.idle():
            stopped.append(len(kwargs.get("complete") or ()))
            worker.request_stop()
        return claim(free, **kwargs)

    monkeypatch.setattr(worker.claimer, "claim", stopping_while_a_success_is_held_back)
    first = app.enqueue("sleep", {"seconds": 0.05})
    second = app.enqueue("sleep", {"seconds": 0.05})
    wait_for(lambda: state_is(db, schema, first, "succeeded"), timeout=10, what="first written")
    wait_for(lambda: state_is(db, schema, second, "ready"), timeout=10, what="second released")
    assert job(db, schema, second)["attempts"] == 0
    assert stopped == [0]  # the claim went ahead: it carried no completion


def test_after_a_claim_that_did_not_fill_the_worker_wakes_when_the_next_job_is_due(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """The claim that took the ready job, with a slot to spare, said when the delayed one
    is due (job_claim_one's last column): the worker, polling only every minute, sleeps
    until then (a job ending is no news to it: its last claim drained the queue)."""
    worker = run_worker(poll_interval=60.0, concurrency=2)
    worker.idle.wait()
    # One transaction, one notification: the claim it brings takes the ready one.
    ready, delayed = app.enqueue_many([("noop", {}), forklift.JobSpec("noop", {}, delay=1.0)])
    wait_for(lambda: state_is(db, schema, ready, "succeeded"), timeout=10, what="ready one")
    wait_for(lambda: state_is(db, schema, delayed, "succeeded"), timeout=10, what="delayed one")


def test_polling_fallback_without_listen(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    run_worker(listen=False, poll_interval=0.3).idle.wait()  # no LISTEN: only the poll
    job_id = app.enqueue("noop")
    wait_for(lambda: state_is(db, schema, job_id, "succeeded"), timeout=5, what="found by polling")


def test_graceful_stop_releases_what_outlasts_grace(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    long_job = app.enqueue("sleep", {"seconds": 30})
    worker = run_worker(grace=0.5)
    wait_for(lambda: state_is(db, schema, long_job, "running"), what="long job running")
    worker.request_stop()
    wait_for(lambda: state_is(db, schema, long_job, "ready"), timeout=5, what="released")
    row = job(db, schema, long_job)
    assert row["attempts"] == 0  # a release does not burn an attempt
    assert row["lease_owner"] is None


def test_graceful_stop_lets_a_short_job_finish(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    short = app.enqueue("sleep", {"seconds": 0.5})
    worker = run_worker(grace=10)
    wait_for(lambda: state_is(db, schema, short, "running"), what="short job running")
    worker.request_stop()
    wait_for(lambda: state_is(db, schema, short, "succeeded"), timeout=5, what="finished")


def test_lost_lease_refuses_completion_and_rolls_back_effect(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("effect", {"key": "lost", "sleep": 1.0})
    run_worker(lease=30)
    wait_for(lambda: state_is(db, schema, job_id, "running"), what="running")
    # Another owner takes the job over (as after an expired lease).
    db.execute(
        f"UPDATE {schema}.jobs SET lease_owner = 'thief', attempts = attempts + 1 WHERE id = %s",
        (job_id,),
    )
    time.sleep(1.5)  # the handler finishes and tries to complete
    row = job(db, schema, job_id)
    assert row["state"] == "running" and row["lease_owner"] == "thief"
    assert effects(db, schema) == []


def test_heartbeat_marks_a_lost_lease_cancelled(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("sleep", {"seconds": 30})
    worker = run_worker(lease=1.5)  # heartbeat every 0.5 s
    wait_for(lambda: state_is(db, schema, job_id, "running"), what="running")
    db.execute(f"UPDATE {schema}.jobs SET lease_owner = 'thief' WHERE id = %s", (job_id,))
    # The sleep task polls ctx.cancelled: once the heartbeat notices, it returns early.
    wait_for(lambda: not len(worker.holdings), timeout=5, what="handler stopped after lease loss")
    row = job(db, schema, job_id)
    assert row["state"] == "running" and row["lease_owner"] == "thief"


def test_expired_lease_is_reclaimed_and_recorded(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'gone:1:x',"
        " seen_running = true, lease_until = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )
    run_worker()
    wait_for(lambda: state_is(db, schema, job_id, "succeeded"), what="reclaimed and done")
    row = job(db, schema, job_id)
    assert row["attempts"] == 2
    assert row["errors"][0]["error"].startswith("LeaseExpired")
    assert row["errors"][0]["worker"] == "gone:1:x"


def test_expired_lease_without_attempts_left_goes_dead(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("noop", max_attempts=1)
    # Its handler was seen running (one never seen is forgiven: test_lost_leases.py).
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'gone:1:x',"
        " seen_running = true, lease_until = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )
    run_worker(maintenance=True)
    wait_for(lambda: state_is(db, schema, job_id, "dead"), what="rescued to dead")
    assert "no attempts left" in job(db, schema, job_id)["last_error"]


def test_priority_orders_claims(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    low = app.enqueue("noop", priority=-5)
    mid = app.enqueue("noop")
    high = app.enqueue("noop", priority=5)
    run_worker()
    wait_for(lambda: state_is(db, schema, low, "succeeded"), what="all done")
    order = [job(db, schema, i)["started_at"] for i in (high, mid, low)]
    assert order == sorted(order)


def test_queues_are_served_only_by_their_workers(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    other = app.enqueue("noop", queue="other")
    mine = app.enqueue("noop", queue="mine")
    worker = run_worker(queues=("mine",))
    wait_for(lambda: state_is(db, schema, mine, "succeeded"), what="mine done")
    worker.idle.wait()  # it claimed again and found nothing: "other" is not its queue
    assert state_is(db, schema, other, "ready")


def test_maintenance_is_a_singleton_across_workers(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    from forklift._locks import lock_key

    job_id = app.enqueue("noop", max_attempts=1)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'gone:1:x',"
        " seen_running = true, lease_until = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )
    worker = run_worker()  # maintenance off in its loop: the test calls it
    key = lock_key(f"maintenance:{schema}")
    # Another replica holds the section: this worker skips it and touches nothing.
    db.execute("SELECT pg_advisory_lock(%s)", (key,))
    try:
        assert worker.services.maintenance.run_once() is None
        assert state_is(db, schema, job_id, "running")
    finally:
        db.execute("SELECT pg_advisory_unlock(%s)", (key,))
    assert worker.services.maintenance.run_once() == Maintained(rescued=1, pruned=0)
    assert state_is(db, schema, job_id, "dead")
    # And it let go: the lock is free again.
    assert db.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone() == (True,)
    db.execute("SELECT pg_advisory_unlock(%s)", (key,))


def test_a_handler_may_work_inside_its_effect_transaction_past_the_session_bounds(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    # Lease 3 s: every other transaction is cut off idle after 2 s. The effect
    # transaction of a job whose lease is renewed may sit idle as long as its task
    # allows: a task with no timeout, an hour; with one, its timeout and a lease more.
    plain = app.enqueue("hold", {"key": "plain", "seconds": 3.5})
    timed = app.enqueue("hold_timed", {"key": "timed", "seconds": 0.0})
    run_worker(lease=3.0)
    for job_id in (plain, timed):

        def finished(job_id: int = job_id) -> bool:
            return job(db, schema, job_id)["state"] in ("succeeded", "dead")

        wait_for(finished, timeout=15, what=f"job {job_id} finished")
        assert job(db, schema, job_id)["last_error"] is None
    assert dict((k, j) for j, k, _ in effects(db, schema)) == {"1h": plain, "43s": timed}


def test_no_claim_fails_on_a_connection_that_was_already_dead(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A storm of pg_terminate_backend (or a failover) kills every idle pooled connection
    # at once; the pool must not hand them out one by one to fail a claim each.
    worker = run_worker(concurrency=4)
    name = f"forklift-worker:{worker.owner.split(':', 1)[1]}"

    def run_some() -> None:
        ids = app.enqueue_many([("noop", {}) for _ in range(8)])
        wait_for(lambda: all(state_is(db, schema, i, "succeeded") for i in ids), what="jobs done")

    for _ in range(5):
        run_some()
        # Idle now, its pooled connections waiting for the next job. Only idle sessions
        # are ended: a claim in flight when its session ends is another matter (that one
        # was alive when it was taken), and an idle worker claims now and then (one came
        # 0.3 s after the jobs, and failed, in 3 runs of 15).
        time.sleep(0.3)
        ended = db.execute(
            "SELECT array_agg(pid) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = %s AND state = 'idle'",
            (name,),
        ).fetchone()
        assert ended is not None and ended[0]
        # A backend sends its session's end on the socket before it exits: once gone, the
        # message is there for the pool's check to see (50 ms was not always enough).
        wait_for(functools.partial(gone, db, ended[0]), what="the ended sessions gone")
    run_some()
    failed = [r.getMessage() for r in caplog.records if "failed" in getattr(r, "event", "")]
    assert failed == []


def gone(db: psycopg.Connection[Any], pids: list[int]) -> bool:
    row = db.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,))
    return row.fetchone() == (0,)


def test_a_started_job_released_at_stop_is_reported_ended(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """The supervisor times started jobs: a release must tell it the job is over."""
    import threading

    from forklift.workers import Worker, WorkerConfig

    started: list[int] = []
    ended: list[tuple[int, str]] = []
    worker = Worker(
        app,
        WorkerConfig(grace=0.0, maintenance=False),
        on_job_start=lambda job: started.append(job.id),
        on_job_end=lambda job, outcome: ended.append((job.id, outcome)),
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    job_id = app.enqueue("sleep", {"seconds": 30})
    wait_for(lambda: started == [job_id], what="job started")
    worker.request_stop()
    thread.join(timeout=15)
    assert not thread.is_alive()
    assert ended == [(job_id, "released")]
    assert state_is(db, schema, job_id, "ready")


def test_jobs_claimed_behind_a_long_one_are_given_back_at_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """A worker that measured tiny jobs claims ahead; when the first of a claim turns out
    long, the ones waiting behind it go back to ready, attempt not counted."""
    worker = run_worker()
    warm = app.enqueue_many([("noop", {}) for _ in range(100)])
    wait_for(lambda: all(state_is(db, schema, i, "succeeded") for i in warm), what="warmed")
    assert worker.prefetch.ahead() > 10  # it would claim ahead now
    long_job, *short = app.enqueue_many(
        [("sleep", {"seconds": 30.0})] + [("noop", {}) for _ in range(20)]
    )
    wait_state = "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND state = 'ready'"
    wait_for(lambda: state_is(db, schema, long_job, "running"), what="the long job running")
    # The claim took short jobs with it (they were leased to this worker) ...
    assert job(db, schema, short[0])["started_at"] is not None
    # ... and gives them back within the release budget (20 ms; the wait is generous).
    wait_for(
        lambda: (
            (db.execute(wait_state.format(s=schema), (short,)).fetchone() or (0,))[0] == len(short)
        ),
        timeout=2,
        what="the short jobs released",
    )
    assert {job(db, schema, i)["attempts"] for i in short} == {0}  # not counted
    assert worker.holdings.waiting() == 0 and len(worker.holdings) == 1
