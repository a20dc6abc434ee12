"""A handler's effect transaction: each ctx.transaction() block rolls back on its own."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.store import JobStore
from forklift.testing import wait_for
from tests.integration.conftest import RunWorker

OWNER = "test-host:1:effects"


class Boom(Exception):
    pass


@pytest.fixture
def task(app: forklift.App) -> Iterator[Callable[..., Any]]:
    """Register a throwaway task on the test app (removed afterwards)."""
    names: list[str] = []

    def register(fn: Callable[..., None], **options: Any) -> str:
        name = fn.__name__
        app.task(name=name, **options)(fn)
        names.append(name)
        return name

    yield register
    for name in names:
        del app.tasks[name]


def finished(db: psycopg.Connection[Any], schema: str, job_id: int) -> tuple[str, int]:
    row = db.execute(f"SELECT state::text, attempts FROM {schema}.jobs WHERE id = %s", (job_id,))
    found = row.fetchone()
    assert found is not None
    return found[0], found[1]


def keys(db: psycopg.Connection[Any], schema: str) -> list[str]:
    return [r[0] for r in db.execute(f"SELECT key FROM {schema}.effects ORDER BY key")]


def run_one(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    name: str,
    until: str = "succeeded",
) -> tuple[str, int]:
    job_id = app.enqueue(name)
    run_worker()
    wait_for(lambda: finished(db, schema, job_id)[0] == until, what=f"job {until}")
    return finished(db, schema, job_id)


def insert(conn: psycopg.Connection[Any], schema: str, key: str) -> None:
    conn.execute(f"INSERT INTO {schema}.effects (key) VALUES (%s)", (key,))


def test_a_caught_exception_rolls_back_the_first_block_and_later_blocks_commit(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def caught_first(ctx: forklift.JobContext) -> None:
        try:
            with ctx.transaction() as c:
                insert(c, schema, "A")
                raise Boom
        except Boom:
            pass
        with ctx.transaction() as c:
            insert(c, schema, "B")

    name = task(caught_first, max_attempts=1)
    assert run_one(app, db, schema, run_worker, name) == ("succeeded", 1)
    assert keys(db, schema) == ["B"]


def test_a_caught_database_error_rolls_back_its_block_and_the_job_goes_on(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def caught_sql(ctx: forklift.JobContext) -> None:
        try:
            with ctx.transaction() as c:
                insert(c, schema, "A")
                c.execute("SELECT 1 / 0")  # aborts the transaction, not only the block
        except psycopg.errors.DivisionByZero:
            pass
        with ctx.transaction() as c:
            insert(c, schema, "B")

    name = task(caught_sql, max_attempts=1)
    assert run_one(app, db, schema, run_worker, name) == ("succeeded", 1)
    assert keys(db, schema) == ["B"]


def test_sequential_blocks_each_roll_back_alone(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def sequence(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as c:
            insert(c, schema, "A")
        try:
            with ctx.transaction() as c:
                insert(c, schema, "B")
                raise Boom
        except Boom:
            pass
        with ctx.transaction() as c:
            insert(c, schema, "C")

    name = task(sequence, max_attempts=1)
    assert run_one(app, db, schema, run_worker, name) == ("succeeded", 1)
    assert keys(db, schema) == ["A", "C"]


def test_nested_blocks_roll_back_to_their_own_start(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def nested(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as c:
            insert(c, schema, "A")
            try:
                with ctx.transaction() as inner:
                    insert(inner, schema, "B")
                    raise Boom
            except Boom:
                pass
            with ctx.transaction() as inner:
                insert(inner, schema, "C")
        try:
            with ctx.transaction() as c:
                insert(c, schema, "D")
                with ctx.transaction() as inner:
                    insert(inner, schema, "E")
                raise Boom  # undoes D and the inner block E with it
        except Boom:
            pass

    name = task(nested, max_attempts=1)
    assert run_one(app, db, schema, run_worker, name) == ("succeeded", 1)
    assert keys(db, schema) == ["A", "C"]


def test_an_uncaught_exception_commits_nothing_and_the_job_is_retried(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def uncaught(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as c:
            insert(c, schema, f"A{ctx.attempt}")
        with ctx.transaction() as c:
            insert(c, schema, f"B{ctx.attempt}")
        if ctx.attempt == 1:
            raise Boom("first attempt")

    name = task(uncaught, max_attempts=2, backoff=forklift.Backoff(base=0.0, jitter=0.0))
    assert run_one(app, db, schema, run_worker, name) == ("succeeded", 2)
    assert keys(db, schema) == ["A2", "B2"]


def test_a_handler_statement_may_outlast_the_workers_own_bound(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    # Lease 3 s: the worker's own statements are cut off after 1 s. The handler's own
    # statements get its task's timeout, or --effect-statement-timeout without one.
    def slow_sql(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as c:
            c.execute("SELECT pg_sleep(1.5)")
            shown = c.execute("SHOW statement_timeout").fetchone()
            assert shown is not None
            insert(c, schema, f"{ctx.task}:{shown[0]}")

    timed = task(slow_sql, max_attempts=1, timeout=20.0)
    untimed = task(_renamed(slow_sql, "slow_sql_untimed"), max_attempts=1)
    ids = [app.enqueue(timed), app.enqueue(untimed)]
    run_worker(lease=3.0)
    for job_id in ids:

        def ended(job_id: int = job_id) -> bool:
            return finished(db, schema, job_id)[0] in ("succeeded", "dead")

        wait_for(ended, what=f"job {job_id} ended")
        assert finished(db, schema, job_id) == ("succeeded", 1)
    assert keys(db, schema) == ["slow_sql:20s", "slow_sql_untimed:5min"]


def test_the_effect_statement_timeout_bounds_a_task_without_one(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    run_worker: RunWorker,
    task: Callable[..., str],
) -> None:
    def too_slow(ctx: forklift.JobContext) -> None:
        with ctx.transaction() as c:
            c.execute("SELECT pg_sleep(3)")

    name = task(too_slow, max_attempts=1)
    job_id = app.enqueue(name)
    run_worker(lease=30.0, effect_statement_timeout=0.5)
    wait_for(lambda: finished(db, schema, job_id)[0] == "dead", what="job dead")
    error = db.execute(f"SELECT last_error FROM {schema}.jobs WHERE id = %s", (job_id,))
    assert "QueryCanceled" in (error.fetchone() or ("",))[0]


def test_the_effect_statement_timeout_ends_with_its_transaction(
    dsn: str, schema: str, app: forklift.App
) -> None:
    pool = _db.make_pool(dsn, _db.Timeouts.for_lease(3.0), max_size=1, name="test-effects")
    pool.open(wait=True, timeout=10)
    try:
        store = JobStore(pool, schema)
        for commit in (True, False):
            app.enqueue("noop")
            (job,) = store.job_claim(["default"], OWNER, 1, 30.0, expired=False)
            effect = store.effect_begin(idle_limit=60.0, statement_limit=120.0)
            shown = effect.conn.execute("SHOW statement_timeout").fetchone()
            assert shown == ("2min",)
            if commit:
                assert effect.commit_completing(job.id, job.attempt, OWNER)
            else:
                effect.rollback()
            with pool.connection() as conn:  # the same one: the pool holds one
                assert conn.execute("SHOW statement_timeout").fetchone() == ("1s",)
                idle = conn.execute("SHOW idle_in_transaction_session_timeout").fetchone()
                assert idle == ("2s",)
    finally:
        pool.close()


def _renamed(fn: Callable[..., None], name: str) -> Callable[..., None]:
    def renamed(ctx: forklift.JobContext) -> None:
        fn(ctx)

    renamed.__name__ = name
    return renamed


def test_the_completion_in_the_effect_transaction_runs_under_the_workers_bound(
    dsn: str, schema: str, app: forklift.App, db: psycopg.Connection[Any]
) -> None:
    # A trigger notes the statement timeout the completion ran under.
    db.execute(
        f"""CREATE FUNCTION {schema}.note_timeout() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO {schema}.effects (key) VALUES (current_setting('statement_timeout'));
            RETURN NEW;
        END $$"""
    )
    db.execute(
        f"CREATE TRIGGER note_timeout AFTER UPDATE ON {schema}.jobs FOR EACH ROW"
        f" WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION {schema}.note_timeout()"
    )
    pool = _db.make_pool(dsn, _db.Timeouts.for_lease(3.0), max_size=1, name="test-effects")
    pool.open(wait=True, timeout=10)
    try:
        store = JobStore(pool, schema)
        app.enqueue("noop")
        (job,) = store.job_claim(["default"], OWNER, 1, 30.0, expired=False)
        effect = store.effect_begin(statement_limit=120.0)
        assert effect.commit_completing(job.id, job.attempt, OWNER)
    finally:
        pool.close()
    assert keys(db, schema) == ["1s"]
