"""Results, batches and progress against a real PostgreSQL, with workers in threads."""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Any

import psycopg
import pytest

import forklift
import forklift.testing
from forklift.store import ClaimedJob
from forklift.testing import wait_for
from tests.integration.conftest import RunWorker


def effects(db: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT job_id, key, n FROM {schema}.effects ORDER BY job_id").fetchall()


def row(db: psycopg.Connection[Any], schema: str, job_id: int) -> dict[str, Any]:
    cur = db.cursor(row_factory=psycopg.rows.dict_row)
    found = cur.execute(f"SELECT * FROM {schema}.jobs WHERE id = %s", (job_id,)).fetchone()
    assert found is not None
    return found


# -- results -------------------------------------------------------------------------------


def test_a_result_is_stored_with_the_completion_and_returned(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    plain = app.enqueue("square", {"n": 7})
    with_effect = app.enqueue("square", {"n": 8, "effect": True})
    nothing = app.enqueue("noop")
    run_worker()
    assert app.result(plain, timeout=30) == 49
    assert app.result(with_effect, timeout=30) == 64
    assert app.result(nothing, timeout=30) is None
    assert row(db, schema, plain)["result"] == 49
    assert row(db, schema, nothing)["result"] is None
    assert effects(db, schema) == [(with_effect, "square-8", 8)]


def test_result_waits_and_is_woken_by_the_completion(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("square", {"n": 3, "sleep": 0.6})
    run_worker()
    began = time.monotonic()
    assert app.result(job_id, timeout=30) == 9
    assert time.monotonic() - began < 10
    assert row(db, schema, job_id)["waited"] is True


def test_result_raises_for_dead_cancelled_unknown_and_slow_jobs(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    dead = app.enqueue("fail", {"message": "no luck"})
    run_worker()
    with pytest.raises(forklift.JobFailed) as failed:
        app.result(dead, timeout=30)
    assert failed.value.error == "RuntimeError: no luck"
    later = app.enqueue("noop", delay=3600)
    with pytest.raises(TimeoutError):
        app.result(later, timeout=0.3)
    with pytest.raises(TimeoutError):
        app.result(later, timeout=0)
    from forklift.admin.jobs import JobAdmin

    waiter: list[BaseException] = []

    def wait() -> None:
        try:
            app.result(later, timeout=30)
        except BaseException as exc:
            waiter.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: row(db, schema, later)["waited"], what="the waiter marked the job")
    JobAdmin(app.dsn, schema).job_cancel_many([later])
    thread.join(timeout=10)
    assert len(waiter) == 1 and isinstance(waiter[0], forklift.JobCancelled)
    with pytest.raises(forklift.JobNotFound):
        app.result(10**12, timeout=1)


def test_a_result_that_is_not_json_or_too_big_ends_the_job_dead_at_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    not_json = app.enqueue("unstorable")
    too_big = app.enqueue("unstorable", {"size": app.max_result_bytes})  # + 2 quotes
    run_worker()
    for job_id in (not_json, too_big):
        with pytest.raises(forklift.JobFailed) as failed:
            app.result(job_id, timeout=30)
        assert failed.value.error is not None and failed.value.error.startswith("ResultError: ")
        assert row(db, schema, job_id)["attempts"] == 1  # not retried: it would not shrink
    assert "set is not JSON" in (row(db, schema, not_json)["last_error"] or "")
    assert "max_result_bytes" in (row(db, schema, too_big)["last_error"] or "")


# -- batches -------------------------------------------------------------------------------


def test_a_batch_runs_its_callback_once_seeing_every_result(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    batch = app.enqueue_batch(
        [("square", {"n": n}) for n in range(1, 41)],
        on_complete="assemble",
        on_complete_args={"out": "sum"},
    )
    assert len(batch.job_ids) == 40
    assert batch.status().pending == 40 and not batch.status().finished
    run_worker(concurrency=4)
    status = batch.wait(timeout=30)
    assert status.finished and status.succeeded == 40 and status.outcome == "succeeded"
    assert batch.results() == {i: n * n for i, n in zip(batch.job_ids, range(1, 41), strict=True)}
    assert status.callback_job_id is not None
    app.result(status.callback_job_id, timeout=30)
    expected = sum(n * n for n in range(1, 41))
    assert effects(db, schema) == [
        (status.callback_job_id, f"batch-{batch.id}:succeeded:0:sum", expected)
    ]
    again = app.get_batch(batch.id)
    assert again.job_ids == batch.job_ids and again.status() == batch.status()


def test_a_batch_with_dead_jobs_finishes_failed_and_its_callback_sees_them(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    batch = app.enqueue_batch(
        [("square", {"n": 2}), ("fail", {"message": "broken tile"})], on_complete="assemble"
    )
    run_worker()
    status = batch.wait(timeout=30)
    assert (status.succeeded, status.dead, status.outcome) == (1, 1, "failed")
    assert list(batch.dead().values()) == ["RuntimeError: broken tile"]
    assert status.callback_job_id is not None
    app.result(status.callback_job_id, timeout=30)
    assert effects(db, schema)[0][1] == f"batch-{batch.id}:failed:1:"


def test_a_streamed_batch_is_sealed_when_its_block_ends(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    run_worker(concurrency=2)
    with app.batch(on_complete="assemble") as b:
        first = b.enqueue(forklift.App.get_task(app, "square"), n=1)
        # Workers finish what is in before the seal: the batch must not finish early.
        wait_for(lambda: row(db, schema, first)["state"] == "succeeded", what="first done")
        time.sleep(0.3)  # a sweep or a completion's check would have finished it by now
        assert not b.status().finished
        b.enqueue_many([("square", {"n": n}) for n in range(2, 6)])
    status = b.wait(timeout=30)
    assert status.total == 5 and status.succeeded == 5
    with pytest.raises(forklift.ArgumentError):
        b.enqueue("square", n=9)


def test_a_batch_block_that_raises_cancels_it_and_the_callback_still_runs_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    with pytest.raises(RuntimeError), app.batch(on_complete="assemble") as b:
        b.enqueue_many(
            [
                (
                    "noop",
                    {},
                )
                for _ in range(3)
            ]
        )
        raise RuntimeError("producer broke")
    run_worker()
    status = b.wait(timeout=30)
    assert status.cancelled == 3 and status.outcome == "cancelled"
    assert status.callback_job_id is not None
    app.result(status.callback_job_id, timeout=30)
    assert [e[1] for e in effects(db, schema)] == [f"batch-{b.id}:cancelled:0:"]


def test_an_empty_batch_finishes_at_once(app: forklift.App, run_worker: RunWorker) -> None:
    batch = app.enqueue_batch([], on_complete="assemble")
    assert batch.status().finished and batch.status().total == 0


def test_batch_jobs_take_no_idempotency_key(app: forklift.App) -> None:
    with pytest.raises(forklift.ArgumentError, match="idempotency key"):
        app.enqueue_batch([forklift.JobSpec("noop", {}, idempotency_key="k")])
    with pytest.raises(forklift.ArgumentError, match="on_complete"):
        app.enqueue_batch([("noop", {})], on_complete_args={"x": 1})
    with pytest.raises(forklift.BatchNotFound):
        app.get_batch(10**12)


def test_retrying_a_dead_batch_job_keeps_the_batch_open_until_it_ends(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    from forklift.admin.jobs import JobAdmin

    batch = app.enqueue_batch([("fail", {"message": "x"})], on_complete="assemble")
    run_worker()
    status = batch.wait(timeout=30)
    assert status.outcome == "failed" and status.callback_job_id is not None
    # After the batch finished, a retry runs the job again outside it: the batch stays
    # finished and its callback does not run again.
    JobAdmin(app.dsn, schema).job_retry_many(batch.job_ids)
    with pytest.raises(forklift.JobFailed):
        app.result(batch.job_ids[0], timeout=30)
    assert batch.status().finished
    app.result(status.callback_job_id, timeout=30)
    assert len(effects(db, schema)) == 1


def test_progress_is_written_while_a_job_runs(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("report", {"steps": 20, "seconds": 2.0})
    run_worker()
    wait_for(
        lambda: (row(db, schema, job_id)["progress"] or {}).get("done", 0) >= 1,
        what="progress written while it runs",
    )
    seen = row(db, schema, job_id)
    assert seen["state"] == "running" and seen["progress"]["total"] == 20
    app.result(job_id, timeout=30)
    final = row(db, schema, job_id)["progress"]
    assert final["done"] == 20 and final["message"] == "step 20" and final["at"]


# -- races ---------------------------------------------------------------------------------


def test_the_last_two_completions_landing_together_enqueue_the_callback_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Two workers complete a batch's last two jobs at the same instant, each then asks
    whether the batch is done: one of them (or both, and one wins) finishes it."""
    from forklift.store.batches import BatchStore

    store = app.store
    rounds = 60
    for _ in range(rounds):
        batch = app.enqueue_batch(
            [forklift.JobSpec("noop", {}, queue="race")] * 2, on_complete="noop"
        )
        held = [store.job_claim(["race"], f"w:{i}:race", 1, 30.0, expired=False)[0] for i in (1, 2)]
        barrier = threading.Barrier(2)

        def complete(
            job: ClaimedJob, owner: str, batch_id: int, barrier: threading.Barrier
        ) -> None:
            barrier.wait()
            store.job_complete_many([(job.id, job.attempt, None, None)], owner)
            BatchStore(store.pool.connection, schema).finish_if_done({batch_id})

        threads = [
            threading.Thread(target=complete, args=(held[i], f"w:{i + 1}:race", batch.id, barrier))
            for i in (0, 1)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert batch.status().finished
    callbacks = db.execute(
        f"SELECT count(*), count(DISTINCT idempotency_key) FROM {schema}.jobs"
        f" WHERE idempotency_key LIKE 'forklift:batch:%%'"
    ).fetchone()
    assert callbacks == (rounds, rounds)


def test_the_sweep_finishes_a_batch_whose_last_end_nobody_followed_up(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A worker killed right after committing the last completion never asks: the sweep
    finishes the batch (and a second sweep finds nothing more to do)."""
    from forklift.workers.batch_ends import BatchSweep

    batch = app.enqueue_batch([forklift.JobSpec("noop", {}, queue="swept")], on_complete="noop")
    job = app.store.job_claim(["swept"], "w:1:x", 1, 30.0, expired=False)[0]
    app.store.job_complete_many([(job.id, job.attempt, None, None)], "w:1:x")
    assert not batch.status().finished
    sweep = BatchSweep(app.batches)
    assert sweep.run_once() == 1
    assert sweep.run_once() == 0
    status = batch.status()
    assert status.finished and status.callback_job_id is not None


def test_retrying_a_dead_batch_job_before_the_batch_finished_keeps_it_open(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    from forklift.admin.jobs import JobAdmin

    batch = app.enqueue_batch(
        [forklift.JobSpec("fail", {"message": "x"}), forklift.JobSpec("noop", {}, delay=4.0)],
        on_complete="assemble",
    )
    dead, _later = batch.job_ids
    run_worker(concurrency=2)
    with pytest.raises(forklift.JobFailed):
        app.result(dead, timeout=30)
    assert not batch.status().finished  # the later one has not run yet
    JobAdmin(app.dsn, schema).job_retry_many([dead])  # back in the batch, to fail again
    status = batch.wait(timeout=30)
    assert status.dead == 1 and status.succeeded == 1
    assert row(db, schema, dead)["attempts"] == 3  # retried: a fresh budget, all spent
    assert status.callback_job_id is not None
    app.result(status.callback_job_id, timeout=30)
    assert len(effects(db, schema)) == 1


def test_a_filling_batch_cancelled_by_an_operator_takes_no_more_jobs(
    app: forklift.App, run_worker: RunWorker
) -> None:
    from forklift.admin.batches import BatchAdmin

    with pytest.raises(forklift.ArgumentError, match="cancelled"), app.batch() as b:
        b.enqueue_many([("noop", {})] * 2)
        BatchAdmin(app.dsn, app.schema).batch_cancel(b.id)
        b.enqueue("noop")
    status = b.status()
    assert status.total == 2 and status.cancelled == 2 and status.finished


def test_progress_takes_numbers_only(app: forklift.App) -> None:
    from forklift.workers.context import JobContext

    ctx = JobContext(ClaimedJob(1, "default", "noop", {}, None, 0, 1, 5, None), app.store)
    for bad in [(True, 3), ("1", None), (1, "3")]:
        with pytest.raises(TypeError, match="numbers"):
            ctx.progress(*bad)  # type: ignore[arg-type]
    ctx.progress(1.5, 3, "m" * 500)
    assert ctx.progress_now == (1.5, 3, "m" * 200)


def test_a_coroutine_returned_by_a_plain_handler_is_no_success(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("returns_coroutine", {"key": "k"})
    run_worker()
    with pytest.raises(forklift.JobFailed, match="does not await: its work did not run"):
        app.result(job_id, timeout=30)
    assert row(db, schema, job_id)["attempts"] == 1  # dead at once: a retry would not await


# -- retention -----------------------------------------------------------------------------


def _end_all(app: forklift.App, queue: str, owner: str = "w:1:x") -> None:
    """Claim and complete every ready job of `queue` (a worker that returns 2 each)."""
    while jobs := app.store.job_claim([queue], owner, 100, 30.0, expired=False):
        app.store.job_complete_many([(j.id, j.attempt, "2", None) for j in jobs], owner)


def _members(db: psycopg.Connection[Any], schema: str, batch_id: int) -> int:
    found = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE batch_id = %s", (batch_id,))
    return int(found.fetchone()[0])  # type: ignore[index]


def _age(db: psycopg.Connection[Any], schema: str) -> None:
    """Every finished job and batch as if it ended an hour ago."""
    db.execute(
        f"UPDATE {schema}.jobs SET completed_at = now() - interval '1 hour'"
        " WHERE completed_at IS NOT NULL"
    )
    db.execute(
        f"UPDATE {schema}.batches SET finished_at = now() - interval '1 hour'"
        " WHERE finished_at IS NOT NULL"
    )


def test_retention_keeps_a_batch_and_its_jobs_until_its_callback_has_finished(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A finished batch past retention whose callback has not run yet (or runs again
    after a failure) keeps its row and every result; once its callback ended, both go."""
    from forklift.workers.batch_ends import BatchSweep

    batch = app.enqueue_batch(
        [forklift.JobSpec("square", {"n": n}, queue="kept") for n in range(51)],
        on_complete=forklift.App.get_task(app, "noop"),
    )
    _end_all(app, "kept")
    BatchSweep(app.batches).run_once()
    status = batch.status()
    assert status.finished and status.callback_job_id is not None
    _age(db, schema)
    app.store.job_prune(0.0, 0.0, 10_000)
    app.batches.prune(0.0)
    kept = _members(db, schema, batch.id)
    assert kept == 51, f"{51 - kept} of 51 results pruned before the callback ran"
    assert len(app.get_batch(batch.id).results()) == 51  # and the batch's row
    # Its callback fails once and waits for its retry: still kept.
    callback = app.store.job_claim(["default"], "w:2:x", 1, 30.0, expired=False)[0]
    assert callback.id == status.callback_job_id
    app.store.job_fail(
        callback.id, callback.attempt, "w:2:x", dead=False, delay=3600, error="boom", traceback=None
    )
    _age(db, schema)
    app.store.job_prune(0.0, 0.0, 10_000)
    app.batches.prune(0.0)
    assert len(app.get_batch(batch.id).results()) == 51
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() - interval '1 hour'"
        " WHERE id = %s",
        (callback.id,),
    )
    app.store.job_prune(0.0, 0.0, 10_000)
    app.batches.prune(0.0)
    with pytest.raises(forklift.BatchNotFound):
        app.get_batch(batch.id)
    assert _members(db, schema, batch.id) == 0


def test_jobs_purge_follows_the_retention_rule_for_a_batch_s_jobs(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """`jobs purge` of an open batch's dead job would turn its outcome from failed to
    succeeded and hide the job from its callback: it keeps what retention keeps."""
    from forklift.admin.jobs import JobAdmin
    from forklift.workers.batch_ends import BatchSweep

    batch = app.enqueue_batch(
        [
            forklift.JobSpec("noop", {}, queue="purged"),
            forklift.JobSpec("noop", {}, queue="purged", max_attempts=1),
            forklift.JobSpec("noop", {}, queue="purged", delay=3600),
        ],
        on_complete="assemble",
    )
    ok, _doomed, later = batch.job_ids
    for job in app.store.job_claim(["purged"], "w:1:x", 10, 30.0, expired=False):
        if job.id == ok:
            app.store.job_complete_many([(job.id, job.attempt, None, None)], "w:1:x")
        else:
            app.store.job_fail(
                job.id, job.attempt, "w:1:x", dead=True, delay=0, error="boom", traceback=None
            )
    admin = JobAdmin(app.dsn, schema)
    purged = admin.job_purge("dead", 0.0, dry_run=False).jobs
    purged += admin.job_purge("succeeded", 0.0, dry_run=False).jobs
    assert purged == 0, f"{purged} of the open batch's 2 ended jobs purged"
    assert admin.job_purge("dead", 0.0, dry_run=True).jobs == 0  # the count says the same
    db.execute(f"UPDATE {schema}.jobs SET available_at = now() WHERE id = %s", (later,))
    _end_all(app, "purged")
    BatchSweep(app.batches).run_once()
    status = batch.status()
    assert (status.outcome, status.succeeded, status.dead) == ("failed", 2, 1)
    # Finished, its callback not run yet: still kept; once the callback ended, purged.
    assert admin.job_purge("succeeded", 0.0, dry_run=False).jobs == 0
    assert status.callback_job_id is not None
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'cancelled', completed_at = now() WHERE id = %s",
        (status.callback_job_id,),
    )
    assert admin.job_purge("dead", 0.0, dry_run=False).jobs == 1
    assert admin.job_purge("succeeded", 0.0, dry_run=False).jobs == 2


# -- waiting -------------------------------------------------------------------------------


def test_a_hundred_waiting_threads_leave_the_producer_its_connections(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """100 threads wait (90 for results, 10 for batches) on a producer pool of 4: an
    enqueue still completes at once, and every wait returns once its job or batch ends."""
    from forklift.workers.batch_ends import BatchSweep

    jobs = app.enqueue_many(
        [forklift.JobSpec("square", {"n": n}, queue="waited") for n in range(90)]
    )
    batches = [app.enqueue_batch([forklift.JobSpec("noop", {}, queue="waited")]) for _ in range(10)]
    answers: dict[int, Any] = {}
    lock = threading.Lock()

    def wait(i: int) -> None:
        try:
            found: Any = (
                app.result(jobs[i], timeout=60)
                if i < 90
                else batches[i - 90].wait(timeout=60).outcome
            )
        except BaseException as exc:
            found = exc
        with lock:
            answers[i] = found

    threads = [threading.Thread(target=wait, args=(i,), daemon=True) for i in range(100)]
    for t in threads:
        t.start()
    waited = f"SELECT count(*) FROM {schema}.jobs WHERE waited AND queue = 'waited'"
    with contextlib.suppress(forklift.testing.WaitTimedOut):  # said below, with the enqueue
        wait_for(lambda: db.execute(waited).fetchone() == (90,), what="90 result waits begun")
    begun = db.execute(waited).fetchone()
    time.sleep(0.5)  # the waits settle into their wait
    listeners = [t for t in threading.enumerate() if t.name == "forklift-waits"]
    assert len(listeners) <= 1, f"{len(listeners)} listeners for one process's waits"
    began = time.monotonic()
    try:
        app.enqueue("noop")
        outcome = "took"
    except forklift.DatabaseError:
        outcome = "failed after"
    took = time.monotonic() - began
    assert (outcome, begun) == ("took", (90,)) and took < 1.0, (
        f"enqueue {outcome} {took:.1f} s while 100 threads waited ({begun} result waits begun)"
    )
    _end_all(app, "waited")
    BatchSweep(app.batches).run_once()  # as a worker's batch ends would
    for t in threads:
        t.join(timeout=30)
    assert len(answers) == 100
    assert [answers[i] for i in range(90)] == [2] * 90
    assert [answers[i] for i in range(90, 100)] == ["succeeded"] * 10


def test_a_wait_is_woken_by_the_end_not_by_its_fallback_poll(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Once the process's LISTEN is in force, an end reaches its waiter as a hint: it
    returns well before the fallback read (every POLL_HEARD seconds) would come."""
    from forklift import _waiting

    job_id = app.enqueue("square", {"n": 3}, queue="woken")
    returned: list[float] = []
    thread = threading.Thread(
        target=lambda: returned.append((app.result(job_id, timeout=60), time.monotonic())[1])
    )
    thread.start()
    wait_for(lambda: app.ends().heard(schema), what="the waiters' LISTEN in force")
    wait_for(lambda: row(db, schema, job_id)["waited"], what="the wait marked the job")
    time.sleep(0.2)  # into its wait
    _end_all(app, "woken")
    ended = time.monotonic()
    thread.join(timeout=30)
    assert returned and returned[0] - ended < _waiting.POLL_HEARD / 2


def test_a_forked_child_waits_on_a_listener_of_its_own(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """The parent waited (its listener and thread exist) before the fork: the child's
    wait makes its own, and the parent's still serves the parent."""
    import os

    timers: list[threading.Timer] = []

    def ended_soon(n: int) -> int:
        job_id = app.enqueue("square", {"n": n}, queue="forked")
        timers.append(threading.Timer(0.3, _end_all, args=(app, "forked")))
        timers[-1].start()
        return job_id

    assert app.result(ended_soon(1), timeout=30) == 2  # _end_all's result
    parents = app.ends()
    wait_for(lambda: parents.heard(schema), what="the parent's LISTEN in force")
    job_id = app.enqueue("square", {"n": 5}, queue="forked")
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if its wait returned on a listener of its own
        code = 2
        try:
            value = app.result(job_id, timeout=30)
            code = 0 if value == 2 and app.ends() is not parents else 1
        finally:
            os._exit(code)
    wait_for(lambda: row(db, schema, job_id)["waited"], what="the child's wait marked the job")
    _end_all(app, "forked")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert app.result(ended_soon(2), timeout=30) == 2
    assert app.ends() is parents
    for timer in timers:  # done with the pool before the app closes it
        timer.join(timeout=10)


# -- unsealed batches ----------------------------------------------------------------------


def test_a_batch_its_producer_left_unsealed_is_finished_as_abandoned(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """A producer killed inside `with app.batch()` leaves its batch filling: once no job
    was added for the sweep's abandon_after, maintenance seals it as abandoned, it
    finishes when its jobs have, and its callback runs once, seeing the outcome
    'abandoned'. A batch whose producer still adds jobs is left alone."""
    from forklift.workers.batch_ends import BatchSweep

    left = app.batch(on_complete="assemble").__enter__()  # its producer dies in the block
    left.enqueue_many([("square", {"n": 3})] * 2)
    busy = app.batch(on_complete="assemble").__enter__()
    worker = run_worker()
    wait_for(lambda: left.status().succeeded == 2, what="the left batch's jobs done")
    sweep = BatchSweep(app.batches, abandon_after=1.0)  # --batch-abandon-after 1s
    busy_ids: list[int] = []

    def swept() -> bool:
        busy_ids.extend(busy.enqueue_many([("noop", {})]))  # still adding: never abandoned
        sweep.run_once()
        return left.status().finished

    wait_for(swept, timeout=15, interval=0.2, what="the sweep finished the abandoned batch")
    status = left.status()
    assert (status.outcome, status.succeeded, status.sealed) == ("abandoned", 2, True)
    assert status.callback_job_id is not None
    app.result(status.callback_job_id, timeout=30)
    assert [e[1] for e in effects(db, schema)] == [f"batch-{left.id}:abandoned:0:"]
    assert not busy.status().sealed
    with pytest.raises(forklift.ArgumentError, match="abandoned"):
        left.enqueue("noop")
    busy.__exit__(None, None, None)
    assert busy.wait(timeout=30).outcome == "succeeded"
    worker.request_stop(fast=True)


def test_batches_cancel_finishes_a_batch_still_filling(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """An operator's cancel of a filling batch (its producer gone) finishes it now: its
    open jobs cancelled, its callback enqueued once."""
    from forklift.admin.batches import BatchAdmin

    b = app.batch(on_complete="assemble").__enter__()
    b.enqueue_many([forklift.JobSpec("noop", {}, queue="filling")] * 3)
    _end_all(app, "filling")
    b.enqueue_many([forklift.JobSpec("noop", {}, queue="filling")])
    done = BatchAdmin(app.dsn, schema).batch_cancel(b.id)
    after = done.after
    assert (after.state, after.row.outcome) == ("finished", "cancelled"), after.state
    assert (after.count("succeeded"), after.count("cancelled")) == (3, 1)
    assert after.row.callback_job_id is not None
