"""Async handlers on a worker's event loop, and the async producer API, on a real PostgreSQL.

The worker runs in this process (conftest's run_worker); what needs a supervisor (its
backstop kill, a blocked loop's leases) is in tests/acceptance/test_async_worker.py.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

import forklift
from forklift.admin import JobAdmin
from forklift.testing import wait_for
from tests.apps import basic
from tests.integration.conftest import RunWorker


def states(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> dict[int, tuple[Any, ...]]:
    rows = db.execute(
        f"SELECT id, state, attempts, last_error, result, crashes FROM {schema}.jobs "
        "WHERE id = ANY(%s)",
        (ids,),
    ).fetchall()
    return {r[0]: tuple(r[1:]) for r in rows}


def effects(db: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    return db.execute(f"SELECT job_id, key, n FROM {schema}.effects ORDER BY key").fetchall()


def test_async_handlers_run_at_once_and_commit_their_effects_with_their_completion(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    basic.ASYNC_RUNNING.update(now=0, most=0)
    ids = app.enqueue_many([("a_effect", {"key": f"k{i:02}", "sleep": 0.3}) for i in range(20)])
    flaky = app.enqueue("a_effect", {"key": "flaky", "fail_first": True})
    worker = run_worker(concurrency=20, prefetch=False)
    wait_for(
        lambda: all(s[0] == "succeeded" for s in states(db, schema, ids).values()),
        20, what="20 async jobs succeeded",
    )  # fmt: skip
    # Twenty 0.3 s sleeps overlapped on one loop, each effect committed once, with the
    # job's completion and its result.
    assert basic.ASYNC_RUNNING["most"] >= 10
    assert [(k, n) for _, k, n in effects(db, schema) if k != "flaky"] == [
        (f"k{i:02}", 1) for i in range(20)
    ]
    assert states(db, schema, [ids[3]])[ids[3]][3] == {"key": "k03", "attempt": 1}
    # A failure after the effect rolls it back; the retry's commits.
    app.enqueue("noop", {})  # wakes nothing in particular: the retry is due by backoff
    wait_for(lambda: states(db, schema, [flaky])[flaky][0] == "succeeded", 30, what="retry")
    assert [(k, n) for _, k, n in effects(db, schema) if k == "flaky"] == [("flaky", 2)]
    # No executor thread was started for them: the loop ran them all.
    assert worker.runs.threads.started <= 1  # the noop's


def test_an_async_timeout_cancels_the_coroutine_with_the_supervisors_words(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("a_sleep", {"seconds": 30})
    run_worker(concurrency=4)
    wait_for(lambda: states(db, schema, [job_id])[job_id][0] == "dead", 15, what="dead")
    _, attempts, error, _, crashes = states(db, schema, [job_id])[job_id]
    assert (attempts, crashes) == (1, 0)
    assert error == f"TimeoutError: job a_sleep#{job_id} timed out after 0.5 s"


@pytest.mark.parametrize("then", ["return", "raise"])
def test_a_handler_that_swallows_its_timeout_still_ends_in_a_timeout_with_its_effect_undone(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker, then: str
) -> None:
    job_id = app.enqueue("a_swallow", {"key": "swallowed", "then": then})
    run_worker(concurrency=4)
    wait_for(
        lambda: states(db, schema, [job_id])[job_id][0] in ("dead", "succeeded"), 15, what="ended"
    )
    state, attempts, error, result, _ = states(db, schema, [job_id])[job_id]
    assert (state, attempts, result) == ("dead", 1, None)
    assert error == f"TimeoutError: job a_swallow#{job_id} timed out after 0.5 s"
    assert effects(db, schema) == []


def test_a_cancel_wakes_wait_cancelled_and_interrupts_a_handler_that_ignores_it(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    basic.ASYNC_NOTES.clear()
    heed = app.enqueue("a_wait", {"key": "heed", "heed": True})
    ignore = app.enqueue("a_wait", {"key": "ignore", "heed": False})
    run_worker(concurrency=4)
    wait_for(lambda: sorted(basic.ASYNC_NOTES) == ["heed:started", "ignore:started"], 10)
    JobAdmin(dsn, schema).job_cancel_many([heed, ignore])
    wait_for(lambda: "ignore:cancelled" in basic.ASYNC_NOTES, 10, what="the CancelledError")
    assert "heed:woke=True" in basic.ASYNC_NOTES
    # The woken one returned at once; the other was cancelled a moment later (aio.CANCEL_AFTER).
    assert basic.ASYNC_NOTES.index("heed:woke=True") < basic.ASYNC_NOTES.index("ignore:cancelled")
    assert {s[0] for s in states(db, schema, [heed, ignore]).values()} == {"cancelled"}


def test_a_handler_gets_the_transaction_of_its_kind(app: forklift.App) -> None:
    from forklift.store import ClaimedJob
    from forklift.workers.context import AsyncJobContext, JobContext

    job = ClaimedJob(1, "default", "noop", {}, None, 0, 1, 5, None)
    refused = pytest.raises(TypeError, match=r"async with ctx\.transaction")
    with refused, AsyncJobContext(job, app.store).transaction():
        pass

    async def enter_async() -> None:
        async with JobContext(job, app.store).transaction():
            pass

    with pytest.raises(TypeError, match=r"plain def handler's is `with ctx\.transaction"):
        asyncio.run(enter_async())


def test_enqueue_async_joins_the_callers_async_transaction(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    task = app.get_task("effect")

    async def produce() -> tuple[int, list[int], int, int]:
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            rolled = await app.enqueue_async("effect", {"key": "rolled"}, conn=conn)
            await conn.rollback()
            kept = await app.enqueue_many_async(
                [("effect", {"key": "m1"}), ("effect", {"key": "m2"})], conn=conn
            )
            keyed = await task.enqueue_async(key="k", idempotency_key="once", conn=conn)
            await conn.commit()
        again = await app.enqueue_async("effect", {"key": "k"}, idempotency_key="once")
        assert again == keyed
        return rolled, kept, keyed, await task.enqueue_async(key="pool")

    rolled, kept, keyed, pooled = asyncio.run(produce())
    found = db.execute(f"SELECT id, args ->> 'key' FROM {schema}.jobs ORDER BY id").fetchall()
    assert found == [(kept[0], "m1"), (kept[1], "m2"), (keyed, "k"), (pooled, "pool")]
    assert rolled not in [r[0] for r in found]
    with pytest.raises(forklift.ArgumentError, match="unknown argument 'kye'"):
        asyncio.run(app.enqueue_async("effect", {"kye": "x"}))


def test_async_and_sync_effect_transactions_share_the_pool_bound(
    app: forklift.App, dsn: str
) -> None:
    from forklift.store import EffectBudget

    budget = EffectBudget(1, timeout=5.0)
    budget.take()  # a sync handler holds the only one
    order: list[str] = []

    async def wait_for_one() -> None:
        order.append("asked")
        await budget.take_async()
        order.append("got")
        budget.give()

    def give() -> None:
        order.append("given")
        budget.give()

    threading.Timer(0.3, give).start()
    asyncio.run(wait_for_one())
    assert order == ["asked", "given", "got"]

    async def cancelled_while_waiting() -> None:
        budget.take()
        waiter = asyncio.ensure_future(budget.take_async())
        await asyncio.sleep(0.1)
        waiter.cancel()
        await asyncio.sleep(0)
        budget.give()  # the cancelled waiter's thread takes it, then gives it back

    asyncio.run(cancelled_while_waiting())
    wait_for(lambda: budget._slots.acquire(timeout=0.1), 5, what="no slot leaked")


def test_an_async_effect_of_a_lost_lease_rolls_back(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    job_id = app.enqueue("a_effect", {"key": "lost", "sleep": 1.0})
    worker = run_worker(lease=30)  # no renewal before the handler's commit
    wait_for(lambda: len(worker.holdings), what="held")
    # Another owner takes the job over (as after an expired lease) while it sleeps.
    db.execute(
        f"UPDATE {schema}.jobs SET lease_owner = 'thief', attempts = attempts + 1 WHERE id = %s",
        (job_id,),
    )
    wait_for(lambda: not len(worker.holdings), 10, what="its outcome refused")
    owner = db.execute(f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", (job_id,))
    assert owner.fetchone() == ("thief",)
    assert effects(db, schema) == []
