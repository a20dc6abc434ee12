"""forklift.testing's helpers for an app's own tests, on a real database: inline mode,
run_job, drain, and the assertions on what is enqueued."""

from __future__ import annotations

import asyncio
import importlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
import forklift.testing
from forklift.admin import AdminStore
from forklift.testing import (
    DrainTimedOut,
    HandlerFailed,
    InlineUnsupported,
    Ran,
    assert_enqueued,
    drain,
    enqueued,
    inline,
    refute_enqueued,
    run_job,
)
from tests.apps import testing_helpers as helpers
from tests.apps.testing_helpers import (
    a_charge,
    charge,
    charge_then_fail,
    fan_out,
    flaky,
    linger,
    pair,
    resumable,
)

Conn = psycopg.Connection[Any]


@pytest.fixture
def app(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[forklift.App]:
    """tests.apps.testing_helpers' app, pointed at this test's schema."""
    monkeypatch.setattr(helpers.app, "_dsn", dsn)
    monkeypatch.setattr(helpers.app, "schema", schema)
    helpers.app.close()
    yield helpers.app
    helpers.app.close()


def effects(conn: Conn, schema: str) -> list[tuple[Any, ...]]:
    """The effect rows `conn` sees: (key, n), in key order."""
    return conn.execute(f"SELECT key, n FROM {schema}.effects ORDER BY key").fetchall()


def jobs(db: Conn, schema: str) -> list[tuple[Any, ...]]:
    """Every job row: (task, state, attempts), in id order."""
    return db.execute(
        f"SELECT task, state::text, attempts FROM {schema}.jobs ORDER BY id"
    ).fetchall()


# -- the package -----------------------------------------------------------------------


def test_the_process_helpers_keep_their_names_beside_the_new_ones() -> None:
    from forklift.testing import (  # noqa: F401  (importable, as tests and benchmarks do)
        ForkliftProcess,
        WaitTimedOut,
        calls_handler,
        child_pids,
        process_state,
        process_title,
        session_pids,
        wait_for,
    )

    # A helper's module imported first must not hide the helper of the same name.
    importlib.import_module("forklift.testing._inline")
    assert callable(forklift.testing.inline) and callable(forklift.testing.drain)
    assert set(forklift.testing.__all__) <= set(dir(forklift.testing))


# -- inline mode -----------------------------------------------------------------------


def test_inline_runs_each_job_at_its_enqueue_and_writes_no_row(
    app: forklift.App, db: Conn, schema: str
) -> None:
    with inline(app) as ran:
        job_id = charge.enqueue(account="a", cents=5)
        assert job_id < 0
        assert ran.result(job_id) == {"account": "a", "cents": 5, "attempt": 1}
        assert effects(db, schema) == [("a", 5)]  # its own connection: committed
        pair_id = app.enqueue("pair", {"a": 1, "b": 2})
        assert ran.result(pair_id) == [1, 2]  # JSON, as app.result() gives it
        app.enqueue_many([("fan_out", {"accounts": ["b", "cc"]})])
        keyed = [charge.enqueue(account="k", cents=1, idempotency_key="once") for _ in range(2)]
        assert keyed[0] == keyed[1]
    assert [r.task for r in ran.runs] == ["charge", "pair", "charge", "charge", "fan_out", "charge"]
    assert [r.args for r in ran.of(charge)][1:3] == [
        {"account": "b", "cents": 1},
        {"account": "cc", "cents": 2},
    ]
    assert {r.outcome for r in ran.runs} == {"succeeded"}
    assert jobs(db, schema) == []
    charge.enqueue(account="z", cents=1)  # the app's own producer, back after the block
    assert jobs(db, schema) == [("charge", "ready", 0)]


def test_inline_effects_join_the_tests_transaction_and_its_rollback_undoes_them(
    app: forklift.App, dsn: str, db: Conn, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.transaction(force_rollback=True), inline(app, conn=conn):
            charge.enqueue(account="a", cents=5)
            fan_out.enqueue(accounts=["b"])
            assert effects(conn, schema) == [("a", 5), ("b", 1)]
            assert effects(db, schema) == []  # not committed
        assert effects(conn, schema) == []
    assert effects(db, schema) == []


def test_a_handler_that_raises_fails_its_enqueue_and_its_effect_rolls_back(
    app: forklift.App, dsn: str, schema: str
) -> None:
    with psycopg.connect(dsn) as conn, conn.transaction(force_rollback=True):
        with inline(app, conn=conn) as ran:
            charge.enqueue(account="a", cents=5)
            with pytest.raises(HandlerFailed) as raised:
                charge_then_fail.enqueue(account="b")
        failed = raised.value
        assert failed.task == "charge_then_fail" and failed.job_args == {"account": "b"}
        assert isinstance(failed.__cause__, RuntimeError)
        assert failed.error == "RuntimeError: card declined for b"
        assert str(failed) == (
            f"job charge_then_fail#{failed.job_id} failed: RuntimeError: card declined for b "
            '(args {"account": "b"})'
        )
        assert [r.outcome for r in ran.runs] == ["succeeded", "failed"]
        assert "Traceback" in (ran.runs[1].traceback or "")
        # Its own block was rolled back to its savepoint; the test's transaction goes on.
        assert effects(conn, schema) == [("a", 5)]


def test_inline_runs_async_handlers_on_the_tests_async_connection(
    app: forklift.App, dsn: str, db: Conn, schema: str
) -> None:
    async def enqueue_in_a_transaction() -> list[tuple[Any, ...]]:
        async with (
            await psycopg.AsyncConnection.connect(dsn) as conn,
            conn.transaction(force_rollback=True),
        ):
            with inline(app, conn=conn) as ran:
                job_id = await a_charge.enqueue_async(account="a", cents=3)
                assert ran.result(job_id) == 3
                cur = await conn.execute(f"SELECT key, n FROM {schema}.effects")
                return await cur.fetchall()

    assert asyncio.run(enqueue_in_a_transaction()) == [("a", 3)]
    assert effects(db, schema) == []
    with inline(app) as ran:  # a plain enqueue: run on a loop of its own
        job_id = a_charge.enqueue(account="b", cents=4)
    assert ran.result(job_id) == 4 and effects(db, schema) == [("b", 4)]
    with (
        psycopg.connect(dsn) as conn,
        inline(app, conn=conn),
        pytest.raises(HandlerFailed, match="needs an AsyncConnection") as raised,
    ):
        a_charge.enqueue(account="c", cents=5)
    assert isinstance(raised.value.__cause__, TypeError)


def test_inline_needs_no_database_until_a_handler_asks_for_one(
    app: forklift.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "_dsn", "postgresql://forklift@127.0.0.1:1/nowhere?connect_timeout=2")
    with inline(app) as ran:
        assert ran.result(pair.enqueue(a=1, b=2)) == [1, 2]
        with pytest.raises(HandlerFailed, match="effect transaction failed") as raised:
            charge.enqueue(account="a", cents=1)
    assert isinstance(raised.value.__cause__, forklift.DatabaseError)


def test_inline_refuses_what_needs_a_job_row(app: forklift.App) -> None:
    with inline(app) as ran:
        with pytest.raises(InlineUnsupported, match="writes no job rows"):
            app.enqueue_batch([("pair", {"a": 1, "b": 2})])
        job_id = pair.enqueue(a=1, b=2)
        with pytest.raises(InlineUnsupported):
            app.result(job_id)
        with pytest.raises(forklift.ArgumentError, match="missing required argument 'b'"):
            app.enqueue("pair", {"a": 1})  # validated as every enqueue is
    assert [r.task for r in ran.runs] == ["pair"]


# -- run_job ---------------------------------------------------------------------------


def test_run_job_calls_one_handler_once_with_a_real_context(app: forklift.App) -> None:
    assert run_job(pair, {"a": 1, "b": 2}) == [1, 2]
    assert run_job(flaky, {"key": "k"}, attempt=2) == "k on attempt 2"
    with pytest.raises(HandlerFailed, match="the card network is away") as raised:
        run_job(flaky, {"key": "k"})
    assert isinstance(raised.value.__cause__, ConnectionError)
    with pytest.raises(forklift.ArgumentError, match="attempt must be between 1 and 2"):
        run_job(flaky, {"key": "k"}, attempt=3)
    with pytest.raises(forklift.ArgumentError, match="unknown argument 'kye'"):
        run_job(flaky, {"kye": "k"})


def test_inline_runs_a_resumable_handler_with_its_checkpoint_in_memory(
    app: forklift.App, dsn: str, db: Conn, schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        with conn.transaction(force_rollback=True), inline(app, conn=conn) as jobs:
            job_id = resumable.enqueue(rows=3)
            assert [n for _, n in effects(conn, schema)] == [0, 1, 2]
        assert effects(conn, schema) == []  # the test's rollback undid every block
    assert jobs.result(job_id) == {"where": "s3://bucket/key", "checkpointed": {"phase": "done"}}
    assert run_job(resumable, {"rows": 0})["checkpointed"] == {"phase": "done"}


# -- drain -----------------------------------------------------------------------------


def test_drain_runs_the_due_jobs_to_their_outcomes_with_a_real_worker(
    app: forklift.App, db: Conn, schema: str
) -> None:
    charge.enqueue(account="a", cents=5)
    flaky.enqueue(key="f")
    app.enqueue("refuse", {"reason": "no such card"})
    fan_out.enqueue(accounts=["b", "cc"])
    charge_then_fail.enqueue(account="x")
    app.enqueue("report", {"day": "monday"})  # another queue
    a_charge.enqueue(account="async", cents=9)

    drained = drain(app, "default")
    assert drained.counts() == {"succeeded": 5, "failed": 2, "dead": 1}, str(drained)
    # In whatever order the worker took them (it claims ahead, and runs the async one on
    # its event loop beside the others).
    assert sorted((r.task, r.outcome) for r in drained.ran) == sorted([
        ("charge", "succeeded"),
        ("flaky", "failed"),
        ("refuse", "dead"),
        ("fan_out", "succeeded"),
        ("charge_then_fail", "failed"),
        ("a_charge", "succeeded"),
        ("charge", "succeeded"),
        ("charge", "succeeded"),
    ])  # fmt: skip

    def one(task: str, **args: Any) -> Ran:
        (found,) = [r for r in drained.ran if r.task == task and args.items() <= r.args.items()]
        return found

    assert one("charge", account="a").result == {"account": "a", "cents": 5, "attempt": 1}
    assert one("flaky").error == "ConnectionError: the card network is away"
    assert one("refuse").error == "Fail: no such card"
    assert "Traceback" in (one("charge_then_fail").traceback or "")
    assert one("a_charge").result == 9
    # Each effect committed with its job's completion; not x's, which rolled back.
    assert effects(db, schema) == [("a", 5), ("async", 9), ("b", 1), ("cc", 2)]
    # The retries wait out their backoff; the other queue was not drained.
    assert [(j.task, j.attempts) for j in enqueued(app)] == [
        ("flaky", 1),
        ("charge_then_fail", 1),
        ("report", 0),
    ]
    assert assert_enqueued(flaky).due_in > 60


def test_drain_with_scheduled_runs_the_retries_until_they_end(
    app: forklift.App, db: Conn, schema: str
) -> None:
    flaky.enqueue(key="f")
    charge_then_fail.enqueue(account="x")
    charge.enqueue(account="later", cents=1, delay=3600)
    assert drain(app).counts() == {"failed": 2}

    drained = drain(app, with_scheduled=True)
    assert sorted((r.task, r.attempt, r.outcome) for r in drained.ran) == [
        ("charge", 1, "succeeded"),
        ("charge_then_fail", 2, "dead"),
        ("flaky", 2, "succeeded"),
    ]
    assert [r.result for r in drained.ran if r.task == "flaky"] == ["f on attempt 2"]
    assert jobs(db, schema) == [
        ("flaky", "succeeded", 2),
        ("charge_then_fail", "dead", 2),
        ("charge", "succeeded", 1),
    ]
    assert drain(app, with_scheduled=True).ran == []


def test_drain_stops_when_what_is_due_is_held_back(
    app: forklift.App, dsn: str, schema: str
) -> None:
    AdminStore(dsn, schema).queue_pause("reports")
    app.enqueue("report", {"day": "monday"})
    drained = drain(app, timeout=10)
    assert (drained.ran, drained.left) == ([], 1)
    assert str(drained) == "nothing ran\n1 due job(s) left unclaimed"


def test_drain_past_its_deadline_stops_its_worker_and_says_what_ended(
    app: forklift.App, db: Conn, schema: str
) -> None:
    charge.enqueue(account="a", cents=5)
    linger.enqueue(seconds=60)
    with pytest.raises(DrainTimedOut) as raised:
        drain(app, timeout=1.0)
    said = str(raised.value)
    assert said.startswith("drain did not finish within 1 s (a handler still running, or ")
    assert "\n  charge#1 attempt 1 succeeded" in said  # (and linger's release, if it began)
    # Told to stop, the handler returned, and its job was given back, the attempt uncounted.
    assert jobs(db, schema) == [("charge", "succeeded", 1), ("linger", "ready", 0)]


# -- enqueued, assert_enqueued, refute_enqueued ------------------------------------------


def test_assert_enqueued_matches_a_subset_of_the_args_and_returns_the_job(
    app: forklift.App, dsn: str
) -> None:
    later = charge.enqueue(account="a", cents=5, delay=60)
    charge.enqueue(account="b", cents=7)
    found = assert_enqueued(charge, args={"account": "a"})
    assert (found.id, found.args, found.queue) == (later, {"account": "a", "cents": 5}, "default")
    assert 50 < found.due_in <= 60
    assert assert_enqueued(app, "charge", {"account": "b", "cents": 7}, queue="default").id
    assert [j.args["account"] for j in enqueued(app, charge)] == ["a", "b"]
    assert [j.args["account"] for j in enqueued(app, args={"cents": 7})] == ["b"]
    assert enqueued(app, "charge", queue="reports") == []
    refute_enqueued(charge, args={"account": "c"})
    refute_enqueued(app, "pair")
    with psycopg.connect(dsn) as conn:  # enqueued in a transaction not committed
        app.enqueue("pair", {"a": 1, "b": 2}, conn=conn)
        assert assert_enqueued(pair, conn=conn).args == {"a": 1, "b": 2}
        refute_enqueued(pair)
        conn.rollback()


def test_a_failed_assertion_lists_what_is_enqueued(app: forklift.App, schema: str) -> None:
    with pytest.raises(AssertionError) as raised:
        assert_enqueued(charge)
    assert str(raised.value) == (
        f"no job enqueued of task 'charge' in any queue, in schema {schema}; "
        "nothing is enqueued (no job ready or scheduled)"
    )
    first = app.enqueue("pair", {"a": 1, "b": 2})
    second = charge.enqueue(account="a", cents=5)
    with pytest.raises(AssertionError) as raised:
        assert_enqueued(charge, args={"account": "b"}, timeout=0.1)
    assert str(raised.value) == (
        "no job enqueued within 0.1 s of task 'charge' with args including "
        f'{{"account":"b"}} in any queue, in schema {schema}; '
        "enqueued are 2 job(s), those of task 'charge' first:\n"
        f'  charge#{second} queue=default args={{"account": "a", "cents": 5}} (due now)\n'
        f'  pair#{first} queue=default args={{"a": 1, "b": 2}} (due now)'
    )
    with pytest.raises(AssertionError) as raised:
        refute_enqueued(charge, args={"cents": 5})
    assert str(raised.value) == (
        "expected no job enqueued of task 'charge' with args including "
        f'{{"cents":5}} in any queue, in schema {schema}, found 1:\n'
        f'  charge#{second} queue=default args={{"account": "a", "cents": 5}} (due now)'
    )


def test_assert_enqueued_waits_for_a_job_another_thread_enqueues(app: forklift.App) -> None:
    later = threading.Timer(0.1, lambda: charge.enqueue(account="t", cents=1))
    later.start()
    try:
        assert assert_enqueued(charge, args={"account": "t"}, timeout=10).args["cents"] == 1
    finally:
        later.join()
