"""Unique jobs (forklift.Unique, DESIGN invariant 29) on a real PostgreSQL: each conflict
policy, period buckets on the database's clock, the states that hold a key, bulk enqueue
with duplicates in one call, the async path, idempotency keys beside unique keys,
refused declarations, and single and bulk producers racing a worker."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import forklift
from forklift import JobSpec, Unique, UniqueConflict, _sql
from forklift.admin import JobAdmin
from forklift.shown.jobview import print_detail, retry_line
from forklift.testing import wait_for
from forklift.unique import OnConflict

OWNER = "test-owner:1:x"


def rows(db: psycopg.Connection[Any], schema: str, task: str) -> list[tuple[Any, ...]]:
    """(id, args, state, available_at) of `task`'s jobs, by id."""
    cursor = db.execute(
        f"SELECT id, args, state::text, available_at FROM {schema}.jobs WHERE task = %s "
        "ORDER BY id",
        (task,),
    )
    return cursor.fetchall()


def account(ctx: forklift.JobContext, *, account: str, full: bool = False) -> None:
    pass


@pytest.fixture
def unique_task(task: Callable[..., str]) -> str:
    """A task unique by its `account` argument, in the default states."""
    return task(account, unique=Unique(keys=["account"]))


def test_keep_returns_the_holder_and_adds_nothing(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    first = app.enqueue(unique_task, {"account": "a"})
    assert app.enqueue(unique_task, {"account": "a", "full": True}) == first
    assert app.enqueue(unique_task, {"account": "a"}, on_conflict="keep") == first
    other = app.enqueue(unique_task, {"account": "b"})
    assert other != first
    found = rows(db, schema, unique_task)
    assert [(r[0], r[1]) for r in found] == [(first, {"account": "a"}), (other, {"account": "b"})]
    # unique=False: this one call is not unique, and neither holds nor meets the key.
    plain = app.enqueue(unique_task, {"account": "a"}, unique=False)
    assert plain not in (first, other)


def test_raise_carries_the_holder_and_adds_nothing(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    first = app.enqueue(unique_task, {"account": "a"})
    with pytest.raises(UniqueConflict) as raised:
        app.enqueue(unique_task, {"account": "a", "full": True}, on_conflict="raise")
    assert raised.value.job_id == first
    assert str(first) in str(raised.value)
    assert len(rows(db, schema, unique_task)) == 1


def test_replace_debounces_a_burst_into_one_job_with_the_last_args_and_time(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, task: Callable[..., str]
) -> None:
    """100 re-render requests in a burst: one job, with the last one's arguments and due
    time (each pushes it later), which runs once, after the burst."""

    def render(ctx: forklift.JobContext, *, doc: int, version: int) -> None:
        pass

    name = task(render, unique=Unique(keys=["doc"]))
    start = datetime.now(UTC) + timedelta(seconds=60)
    ids = {
        app.enqueue(
            name,
            {"doc": 7, "version": i},
            run_at=start + timedelta(milliseconds=i),
            on_conflict="replace",
        )
        for i in range(100)
    }
    assert len(ids) == 1
    [(job_id, args, state, due)] = rows(db, schema, name)
    assert ids == {job_id}
    assert args == {"doc": 7, "version": 99}
    assert state == "ready"
    assert due == start + timedelta(milliseconds=99)


def test_replace_and_keep_leave_a_running_holder_alone(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    """A running job holds its key (running is in every set): a replace returns it and
    changes nothing, and no second job goes in beside it."""
    first = app.enqueue(unique_task, {"account": "a"})
    [claimed] = app.store.job_claim(["default"], OWNER, 1, 30.0, expired=False)
    assert claimed.id == first
    assert app.enqueue(unique_task, {"account": "a", "full": True}, on_conflict="replace") == first
    assert app.enqueue(unique_task, {"account": "a"}) == first
    assert [(r[0], r[1], r[2]) for r in rows(db, schema, unique_task)] == [
        (first, {"account": "a"}, "running")
    ]


def test_a_finished_job_frees_the_key_unless_its_states_name_its_end(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    task: Callable[..., str],
    run_worker: Callable[..., Any],
) -> None:
    def freed(ctx: forklift.JobContext, *, account: str) -> None:
        pass

    def kept(ctx: forklift.JobContext, *, account: str) -> None:
        pass

    loose = task(freed, unique=Unique(keys=["account"]))
    tight = task(kept, unique=Unique(states={"ready", "running", "succeeded"}))
    first, held = app.enqueue(loose, {"account": "a"}), app.enqueue(tight, {"account": "a"})
    run_worker()
    wait_for(
        lambda: {r[2] for r in rows(db, schema, loose) + rows(db, schema, tight)} == {"succeeded"},
        what="both jobs succeeded",
    )
    again = app.enqueue(loose, {"account": "a"})
    assert again != first  # succeeded is not in its states: the key is free
    assert app.enqueue(tight, {"account": "a"}) == held  # succeeded holds it


def test_a_period_frees_the_key_when_the_database_clock_enters_the_next(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, task: Callable[..., str]
) -> None:
    """Buckets are counted on the database's clock: within one, one job; once its clock
    is in the next (waited for on that clock, not slept), a new job."""

    def ping(ctx: forklift.JobContext, *, host: str) -> None:
        pass

    period = 0.5
    name = task(ping, unique=Unique(period=period))
    first = app.enqueue(name, {"host": "h"})
    key = db.execute(f"SELECT unique_key FROM {schema}.jobs WHERE id = %s", (first,)).fetchone()
    assert key is not None
    bucket = int(key[0].rpartition("@")[2])

    def now_bucket() -> int:
        row = db.execute("SELECT floor(extract(epoch FROM now())::float8 / %s)", (period,))
        return int(row.fetchone()[0])  # type: ignore[index]

    if now_bucket() == bucket:
        assert app.enqueue(name, {"host": "h"}) == first
    wait_for(lambda: now_bucket() > bucket, timeout=5, what="the next period")
    second = app.enqueue(name, {"host": "h"})
    assert second != first
    assert len(rows(db, schema, name)) == 2  # both live: one per period


def test_bulk_enqueue_dedupes_one_call_and_meets_live_holders(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    held = app.enqueue(unique_task, {"account": "held"})
    ids = app.enqueue_many(
        [
            JobSpec(unique_task, {"account": "a"}),
            (unique_task, {"account": "a", "full": True}),
            ("noop", {}),
            JobSpec(unique_task, {"account": "held"}),
            JobSpec(unique_task, {"account": "b"}, delay=30),
            JobSpec(unique_task, {"account": "a"}),
        ]
    )
    assert ids[0] == ids[1] == ids[5]
    assert ids[3] == held
    assert len(set(ids)) == 4
    found = {r[0]: r[1] for r in rows(db, schema, unique_task)}
    assert found[ids[0]] == {"account": "a"}  # the first of a key's duplicates goes in
    assert len(found) == 3


def test_a_big_bulk_goes_by_copy_and_meets_holders_as_an_insert_would(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, task: Callable[..., str]
) -> None:
    """100 unique jobs in one call go in by COPY (_inserts.UniqueInserts._copied), their
    keys stored as the INSERT stores them (the period's number from the database's
    clock): a single enqueue of one of them meets it. A call whose jobs meet one holder
    goes back to the INSERT: the holder's id for its key, the rest inserted; with
    on_conflict="raise", UniqueConflict and none of the call inserted."""
    name = task(account, unique=Unique(keys=["account"], period=3600))
    copied = app.enqueue_many([(name, {"account": f"a{i}"}) for i in range(100)])
    first = min(copied)
    assert sorted(copied) == list(range(first, first + 100))  # reserved at once: by COPY
    assert app.enqueue(name, {"account": "a42"}) == copied[42]
    holder = app.enqueue(name, {"account": "b50"})
    mixed = app.enqueue_many([(name, {"account": f"b{i}"}) for i in range(100)])
    assert mixed[50] == holder and len(set(mixed)) == 100
    count = f"SELECT count(*) FROM {schema}.jobs WHERE task = %s"
    assert db.execute(count, (name,)).fetchone() == (200,)
    with pytest.raises(UniqueConflict) as raised:
        app.enqueue_many(
            [JobSpec(name, {"account": f"c{i}"}, on_conflict="raise") for i in range(99)]
            + [JobSpec(name, {"account": "b7"}, on_conflict="raise")]
        )
    assert raised.value.job_id == mixed[7]
    assert db.execute(count, (name,)).fetchone() == (200,)


def test_bulk_replace_takes_the_last_of_a_key_and_replaces_a_ready_holder(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    held = app.enqueue(unique_task, {"account": "held"})
    specs = [
        JobSpec(unique_task, {"account": k, "full": full}, on_conflict="replace")
        for k, full in (("a", False), ("held", True), ("a", True))
    ]
    ids = app.enqueue_many(specs)
    assert ids[0] == ids[2] and ids[1] == held
    found = {r[0]: r[1] for r in rows(db, schema, unique_task)}
    assert found == {
        held: {"account": "held", "full": True},
        ids[0]: {"account": "a", "full": True},
    }


def test_bulk_raise_inserts_none_of_the_call(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    held = app.enqueue(unique_task, {"account": "held"})
    with pytest.raises(UniqueConflict) as raised:
        app.enqueue_many(
            [
                ("noop", {}),
                JobSpec(unique_task, {"account": "new"}, on_conflict="raise"),
                JobSpec(unique_task, {"account": "held"}, on_conflict="raise"),
            ]
        )
    assert raised.value.job_id == held
    assert len(rows(db, schema, unique_task)) == 1
    assert rows(db, schema, "noop") == []


def test_the_async_path_and_a_callers_transaction(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    async def go() -> tuple[int, int, list[int], int]:
        first = await app.enqueue_async(unique_task, {"account": "a"})
        again = await app.enqueue_async(unique_task, {"account": "a"}, on_conflict="replace")
        many = await app.enqueue_many_async(
            [(unique_task, {"account": "a"}), (unique_task, {"account": "b"})]
        )
        async with await psycopg.AsyncConnection.connect(dsn) as conn:
            inside = await app.enqueue_async(unique_task, {"account": "b"}, conn=conn)
            await conn.commit()
        return first, again, many, inside

    first, again, many, inside = asyncio.run(go())
    assert again == first and many[0] == first and inside == many[1]
    assert len(rows(db, schema, unique_task)) == 2


def test_idempotency_keys_keep_their_meaning_beside_unique_keys(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    """An idempotency key names one enqueue: the same key again returns its job, under
    keep and under raise alike (the holder of the unique key is that job). A unique
    key held by another job is met as ever, the idempotency key then not stored."""
    first = app.enqueue(unique_task, {"account": "a"}, idempotency_key="req-1")
    assert app.enqueue(unique_task, {"account": "a"}, idempotency_key="req-1") == first
    again = app.enqueue(unique_task, {"account": "a"}, idempotency_key="req-1", on_conflict="raise")
    assert again == first
    assert app.enqueue(unique_task, {"account": "a"}, idempotency_key="req-2") == first
    with pytest.raises(UniqueConflict):
        app.enqueue(unique_task, {"account": "a"}, idempotency_key="req-3", on_conflict="raise")
    # A key taken by a job of another unique key: that job, whose key it is.
    assert app.enqueue(unique_task, {"account": "b"}, idempotency_key="req-1") == first
    assert [r[0] for r in rows(db, schema, unique_task)] == [first]
    with pytest.raises(forklift.ArgumentError, match="takes no idempotency_key"):
        app.enqueue(unique_task, {"account": "a"}, idempotency_key="k", on_conflict="replace")


def test_refused_declarations_and_options(
    app: forklift.App, unique_task: str, task: Callable[..., str]
) -> None:
    for bad, said in (
        ({"states": {"ready"}}, "must include 'ready' and 'running'"),
        ({"states": {"ready", "running", "done"}}, "unknown job state"),
        ({"states": {"ready", "running", "blocked"}}, "workflow"),
        ({"period": 0}, "period must be > 0"),
        ({"period": True}, "period must be seconds"),
        ({"keys": "account"}, "list of argument names"),
        ({"keys": []}, "names no argument"),
    ):
        with pytest.raises(forklift.ConfigError, match=said):
            Unique(**bad)

    def charge(ctx: forklift.JobContext, *, account: str) -> None:
        pass

    with pytest.raises(forklift.ConfigError, match="'acount', no argument of its handler"):
        task(charge, unique=Unique(keys=["acount"]))
    with pytest.raises(forklift.ConfigError, match=r"must be a forklift\.Unique"):
        task(charge, unique={"keys": ["account"]})
    with pytest.raises(forklift.ArgumentError, match="no argument of its handler"):
        app.enqueue(unique_task, {"account": "a"}, unique=Unique(keys=["nope"]))
    with pytest.raises(forklift.ArgumentError, match="is for unique jobs"):
        app.enqueue("noop", on_conflict="keep")
    with pytest.raises(forklift.ArgumentError, match="on_conflict is 'keep'"):
        app.enqueue(unique_task, {"account": "a"}, on_conflict="skip")  # type: ignore[arg-type]
    with pytest.raises(forklift.ArgumentError, match=r"a forklift\.Unique or False"):
        app.enqueue(unique_task, {"account": "a"}, unique=True)  # type: ignore[arg-type]
    wf = app.workflow("w")
    with pytest.raises(forklift.ArgumentError, match="never unique"):
        wf.add(unique_task, {"account": "a"}, unique=Unique())
    with pytest.raises(forklift.ArgumentError, match="never unique"):
        app.enqueue_batch([JobSpec(unique_task, {"account": "a"}, on_conflict="keep")])


def test_batches_and_workflows_make_plain_jobs_of_a_unique_task(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    held = app.enqueue(unique_task, {"account": "a"})
    batch = app.enqueue_batch([(unique_task, {"account": "a"})])
    wf = app.workflow("w")
    wf.add(unique_task, {"account": "a"})
    wf.enqueue()
    found = db.execute(
        f"SELECT id, unique_key IS NOT NULL FROM {schema}.jobs WHERE task = %s ORDER BY id",
        (unique_task,),
    ).fetchall()
    assert len(found) == 3 and found[0] == (held, True)
    assert [u for _, u in found[1:]] == [False, False]
    assert batch.id


def test_a_retry_is_refused_while_another_job_holds_the_key(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    """A dead unique job whose key another live job took since is not retried (it would
    be a second live job of the key), and says which job holds it; the other jobs named
    in the same retry are retried. Before, the retry failed whole with a UniqueViolation
    (DatabaseError), none of them retried."""
    dead = app.enqueue(unique_task, {"account": "a"})
    other = app.enqueue(unique_task, {"account": "b"})
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now() WHERE id = ANY(%s)",
        ([dead, other],),
    )
    holder = app.enqueue(unique_task, {"account": "a"})
    assert holder != dead
    acted = {a.id: a for a in JobAdmin(app.dsn, schema).job_retry_many([dead, other])}
    assert not acted[dead].done and acted[dead].held_by == holder
    assert retry_line(acted[dead]) == (
        f"job {dead}: not retried: job {holder} holds its unique key now (a retry would make "
        "a second live job of it)"
    )
    assert acted[other].done and acted[other].held_by is None
    states = dict(db.execute(f"SELECT id, state::text FROM {schema}.jobs").fetchall())
    assert states == {dead: "dead", other: "ready", holder: "ready"}


def test_a_replace_that_makes_the_holder_due_wakes_its_workers(
    app: forklift.App, dsn: str, unique_task: str, run_worker: Any
) -> None:
    """A replace in the caller's transaction moves a job due in an hour to now: the idle
    worker hears of it at its commit (an update, unlike an insert, wakes no one by
    itself), not at its next poll (60 s)."""
    job_id = app.enqueue(unique_task, {"account": "a"}, delay=3600)
    run_worker(poll_interval=60.0).idle.wait()  # asleep now, for a minute unless woken
    with psycopg.connect(dsn) as conn:
        assert (
            app.enqueue(unique_task, {"account": "a"}, on_conflict="replace", conn=conn) == job_id
        )
    with psycopg.connect(dsn) as conn:
        wait_for(
            lambda: (
                conn.execute(
                    f"SELECT state = 'succeeded' FROM {app.schema}.jobs WHERE id = %s", (job_id,)
                ).fetchone()
                == (True,)
            ),
            timeout=20,
            what="the replaced job run",
        )


def test_jobs_show_says_the_unique_key(
    app: forklift.App, schema: str, unique_task: str, capsys: pytest.CaptureFixture[str]
) -> None:
    job_id = app.enqueue(unique_task, {"account": "a"})
    detail = JobAdmin(app.dsn, schema).job_get(job_id)
    print_detail(detail)
    out = capsys.readouterr().out
    assert f"unique key   {detail.unique_key} (held while ready, running)" in out
    assert detail.unique_key is not None and len(detail.unique_key) == 64


def test_a_schedule_of_a_unique_task_skips_a_fire_while_a_job_holds_its_key(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, unique_task: str
) -> None:
    from forklift.scheduler.store import ScheduleSession

    held = app.enqueue(unique_task, {"account": "s"})
    schedule = app.periodic(task=unique_task, every=60, args={"account": "s"}, name="s")
    at = datetime(2030, 1, 1, tzinfo=UTC)
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        session = ScheduleSession(conn, _sql.load("forklift.scheduler", "queries.sql", schema))
        fired = session.schedule_fire(schedule, at)
    del app.schedules["s"]
    assert fired.job_id is None and not fired.busy
    assert [r[0] for r in rows(db, schema, unique_task)] == [held]


# -- racing producers --------------------------------------------------------------

MOVES = """
CREATE TABLE {schema}.unique_moves (
    job_id bigint, unique_key text, holds boolean, at timestamptz DEFAULT clock_timestamp()
);
CREATE FUNCTION {schema}.unique_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {schema}.unique_moves (job_id, unique_key, holds)
    VALUES (NEW.id, NEW.unique_key, {schema}.unique_holds(NEW.state, NEW.unique_states));
    RETURN NULL;
END $$;
CREATE TRIGGER unique_moved AFTER INSERT OR UPDATE OF state ON {schema}.jobs
    FOR EACH ROW WHEN (NEW.unique_key IS NOT NULL) EXECUTE FUNCTION {schema}.unique_moved();
"""

LIVE_TWICE = """
SELECT unique_key FROM {schema}.jobs
WHERE unique_key IS NOT NULL AND {schema}.unique_holds(state, unique_states)
GROUP BY unique_key HAVING count(*) > 1
"""


def overlaps(moves: list[tuple[int, str, bool, datetime]]) -> list[str]:
    """The keys that two jobs held at once, replaying every recorded move in time order
    (a move is recorded in the transaction that made it: a rolled-back one left none).
    A job that takes a key another gave up waited on the index for that one's commit,
    so its move is recorded after the other's; at one instant, a release goes first."""
    holding: dict[str, set[int]] = defaultdict(set)
    bad = []
    for job_id, key, holds, _ in sorted(moves, key=lambda m: (m[3], m[2])):
        if holds:
            holding[key].add(job_id)
        else:
            holding[key].discard(job_id)
        if len(holding[key]) > 1:
            bad.append(f"{key}: {sorted(holding[key])}")
    return bad


@pytest.fixture
def moves(db: psycopg.Connection[Any], schema: str) -> Iterator[Callable[[], list[str]]]:
    """Every move of a unique job, recorded by a test trigger; the overlaps found."""
    db.execute(MOVES.format(schema=schema))

    def found() -> list[str]:
        rows = db.execute(f"SELECT job_id, unique_key, holds, at FROM {schema}.unique_moves")
        return overlaps(rows.fetchall())

    yield found


def race(
    app: forklift.App, name: str, schema: str, seconds: float, keys: int = 6, most: int = 12
) -> list[BaseException]:
    """4 producers (2 one by one, 2 in bulk of 1 to `most` jobs, keep and replace, the
    same `keys` keys) and a sampler that looks for a key with two live jobs, for
    `seconds`; what they raised."""
    stop = threading.Event()
    errors: list[BaseException] = []

    def producer(bulk: bool, seed: int) -> None:
        rng = random.Random(seed)
        try:
            while not stop.is_set():
                policy: OnConflict = rng.choice(["keep", "replace"])
                if bulk:
                    specs = [
                        JobSpec(name, {"key": rng.randrange(keys), "n": i}, on_conflict=policy)
                        for i in range(rng.randrange(1, most))
                    ]
                    app.enqueue_many(specs)
                else:
                    app.enqueue(name, {"key": rng.randrange(keys), "n": 0}, on_conflict=policy)
        except BaseException as exc:  # reported by the test
            errors.append(exc)

    def sampler() -> None:
        with psycopg.connect(app.dsn, autocommit=True) as conn:
            while not stop.is_set():
                found = conn.execute(LIVE_TWICE.format(schema=schema)).fetchall()
                if found:
                    errors.append(AssertionError(f"two live jobs of one key: {found}"))

    threads = [threading.Thread(target=producer, args=(i % 2 == 0, i)) for i in range(4)]
    threads.append(threading.Thread(target=sampler))
    for thread in threads:
        thread.start()
    time.sleep(seconds)  # the length of the race, not a wait for an outcome
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    return errors


@pytest.mark.parametrize(
    ("keys", "most"),
    [(6, 12), (300, 200)],
    ids=["small bulks by INSERT", "bulks of 50-200 by COPY first"],
)
def test_single_and_bulk_producers_racing_a_worker_never_make_two_live_jobs(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    task: Callable[..., str],
    run_worker: Callable[..., Any],
    moves: Callable[[], list[str]],
    keys: int,
    most: int,
) -> None:
    """Producers race a worker for 3 s (race()); the sampler and the moves trigger find
    no key that ever had two live jobs, and no producer failed (no deadlock among
    bulk enqueues, nor with the worker's completions). Bulks of 50 or more go by COPY
    first (_inserts.UniqueInserts._copied), and back to the INSERT when one meets a
    holder."""

    def tick(ctx: forklift.JobContext, *, key: int, n: int) -> None:
        time.sleep(0.002)

    name = task(tick, unique=Unique(keys=["key"]))
    run_worker(concurrency=4)
    errors = race(app, name, schema, 3.0, keys, most)
    assert not errors, errors
    wait_for(
        lambda: (
            not db.execute(
                f"SELECT 1 FROM {schema}.jobs WHERE state IN ('ready', 'running') LIMIT 1"
            ).fetchone()
        ),
        timeout=30,
        what="the queue drained",
    )
    inserted = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE task = %s", (name,))
    assert inserted.fetchone()[0] > 20  # type: ignore[index]  # keys were freed and taken again
    assert moves() == []
