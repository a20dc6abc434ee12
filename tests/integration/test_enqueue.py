"""The producer API: ids, idempotency keys, the caller's transaction, refused arguments."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import forklift
from tests.apps import basic


def count(db: psycopg.Connection[Any], schema: str, where: str = "true") -> int:
    return int(db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE {where}").fetchone()[0])  # type: ignore[index]


def test_enqueue_returns_id_with_task_defaults(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    from tests.apps import basic

    job_id = basic.fail.enqueue(message="x")
    row = db.execute(
        f"SELECT task, args, queue, priority, max_attempts, state FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row == ("fail", {"message": "x"}, "default", 0, 3, "ready")


def test_a_forked_child_enqueues_on_a_pool_of_its_own(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """An App used before a fork: in the child its enqueue opens a pool of the child's
    own (the parent's sockets are never touched there), and the parent's pool still
    serves the parent."""
    app.enqueue("noop")
    parents = app.store.pool
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if it enqueued on a pool of its own
        code = 2
        try:
            app.enqueue("noop")
            code = 0 if app.store.pool is not parents else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    app.enqueue("noop")
    assert app.store.pool is parents
    assert count(db, schema) == 3


def test_same_idempotency_key_returns_the_existing_job(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    first = app.enqueue("noop", idempotency_key="k1")
    again = app.enqueue("noop", idempotency_key="k1")
    other = app.enqueue("noop", idempotency_key="k2")
    assert first == again != other
    assert count(db, schema) == 2


def test_enqueue_joins_the_callers_transaction(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        rolled_back = app.enqueue("noop", conn=conn)
        conn.rollback()
        kept = app.enqueue("noop", conn=conn)
        assert count(db, schema) == 0  # not visible before the caller commits
        conn.commit()
    assert count(db, schema, f"id = {kept}") == 1
    assert count(db, schema, f"id = {rolled_back}") == 0


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        ({"key": "a\x00b"}, "['key']"),
        ({"key": "k", "n": float("nan")}, "['n']"),
        ({"key": "k", "n": float("inf")}, "['n']"),
        ({"key": {1: "x"}}, "key 1"),
        ({"key": object()}, "['key']"),
    ],
)
def test_bad_arguments_are_refused_naming_the_key(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, args: dict[str, Any], fragment: str
) -> None:
    with pytest.raises(forklift.ArgumentError) as err:
        app.enqueue("effect", args)
    assert fragment in str(err.value)
    assert count(db, schema) == 0


def test_arguments_that_do_not_fit_a_known_handler_are_refused(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    with pytest.raises(forklift.ArgumentError, match="key"):
        app.enqueue("effect", {"n": 1})
    with pytest.raises(forklift.ArgumentError, match="unknown argument 'bogus'"):
        app.enqueue("effect", {"key": "k", "bogus": 1})
    assert count(db, schema) == 0


def test_a_producer_only_app_enqueues_tasks_other_workers_define(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    producer = forklift.App(dsn, schema=schema)  # no tasks registered: any name goes
    job_id = producer.enqueue("elsewhere.task", {"x": [1, 2]}, queue="remote", priority=3)
    producer.close()
    row = db.execute(
        f"SELECT task, queue, priority FROM {schema}.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == ("elsewhere.task", "remote", 3)


def test_delay_and_run_at(app: forklift.App, db: psycopg.Connection[Any], schema: str) -> None:
    delayed = app.enqueue("noop", delay=timedelta(minutes=5))
    at = datetime.now(UTC) + timedelta(hours=1)
    scheduled = app.enqueue("noop", run_at=at)
    gap = db.execute(
        f"SELECT extract(epoch FROM available_at - created_at) FROM {schema}.jobs WHERE id = %s",
        (delayed,),
    ).fetchone()[0]  # type: ignore[index]
    assert 299 <= float(gap) <= 301
    when = db.execute(
        f"SELECT available_at FROM {schema}.jobs WHERE id = %s", (scheduled,)
    ).fetchone()[0]  # type: ignore[index]
    assert abs((when - at).total_seconds()) < 0.001
    with pytest.raises(forklift.ArgumentError, match="timezone"):
        app.enqueue("noop", run_at=datetime.now())
    with pytest.raises(forklift.ArgumentError, match=">= 0"):
        app.enqueue("noop", delay=-1)


def test_enqueue_many_keeps_input_order_and_dedupes_keys(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    existing = app.enqueue("noop", idempotency_key="old")
    specs: list[forklift.JobSpec | tuple[str, dict[str, Any]]] = [
        ("effect", {"key": "0"}),
        forklift.JobSpec("effect", {"key": "1"}, idempotency_key="new"),
        forklift.JobSpec("effect", {"key": "2"}, delay=60),
        forklift.JobSpec("noop", {}, idempotency_key="old"),
        ("effect", {"key": "4"}),
        forklift.JobSpec("effect", {"key": "5"}, idempotency_key="new"),
    ]
    ids = app.enqueue_many(specs)
    assert len(ids) == 6
    assert ids[3] == existing
    assert ids[1] == ids[5]
    assert len(set(ids)) == 5
    for i in (0, 2, 4):
        args = db.execute(f"SELECT args FROM {schema}.jobs WHERE id = %s", (ids[i],)).fetchone()
        assert args == ({"key": str(i)},)
    assert count(db, schema) == 5


def test_enqueue_many_is_all_or_nothing(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    with pytest.raises(forklift.ArgumentError):
        app.enqueue_many([("noop", {}), ("noop", {"bad": float("nan")})])
    with pytest.raises(forklift.ArgumentError, match=r"as a tuple is \(task name, args\)"):
        app.enqueue_many([("noop", {}), ("noop", {}, 5)])  # type: ignore[list-item]
    with pytest.raises(forklift.ArgumentError, match=r"JobSpec or a \(task name, args\) tuple"):
        app.enqueue_many([("noop", {}), {"task": "noop"}])  # type: ignore[list-item]
    assert count(db, schema) == 0


def test_enqueue_many_in_callers_transaction(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        app.enqueue_many([("noop", {}) for _ in range(10)], conn=conn)
        conn.rollback()
    assert count(db, schema) == 0


def test_enqueue_many_on_its_own_connection_keeps_a_mixed_batch_in_order_across_chunks(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    # The jobs are validated as the COPY takes them: plain, keyed and delayed ones
    # interleaved, over statements of 20 rows, each job where its spec said.
    existing = app.enqueue("effect", {"key": "old"}, idempotency_key="k0")
    app.store.inserts.chunk = 20
    specs: list[forklift.JobSpec | tuple[str, dict[str, Any]]] = []
    for n in range(300):
        if n % 7 == 0:  # keys k0 (taken before), k7, ... and each again 70 jobs on
            key = f"k{n % 70}"
            specs.append(forklift.JobSpec("effect", {"key": key}, idempotency_key=key))
        elif n % 11 == 0:
            specs.append(forklift.JobSpec("effect", {"key": f"later{n}"}, delay=60))
        else:
            specs.append(("effect", {"key": f"plain{n}"}))
    ids = app.enqueue_many(specs)
    assert len(ids) == 300
    assert ids[0] == ids[70] == existing
    assert ids[7] == ids[77] != existing
    args = dict(db.execute(f"SELECT id, args->>'key' FROM {schema}.jobs").fetchall())
    assert len(args) == len(set(ids)) == 1 + 9 + 300 - 43  # the old key, 9 new, the rest
    for i, spec in enumerate(specs):
        if isinstance(spec, tuple):
            assert args[ids[i]] == spec[1]["key"], i
        elif i % 70:
            assert args[ids[i]] == spec.args["key"], i
    assert count(db, schema, "available_at > now() + interval '30 seconds'") == 24


def test_a_job_refused_in_the_middle_of_a_streamed_enqueue_many_inserts_none(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    # Two COPY statements of 20 have gone in when the 50th job is refused.
    app.store.inserts.chunk = 20
    specs: list[tuple[str, dict[str, Any]]] = [("effect", {"key": str(n)}) for n in range(100)]
    specs[49] = ("effect", {"key": float("nan")})
    with pytest.raises(forklift.ArgumentError, match=r"\['key'\]: nan is not valid JSON"):
        app.enqueue_many(specs)
    specs[49] = ("nosuch", {})
    with pytest.raises(forklift.UnknownTaskError):
        app.enqueue_many(specs)
    assert count(db, schema) == 0
    specs[49] = ("effect", {"key": "49"})
    assert len(app.enqueue_many(specs)) == 100  # its connection went back to the pool clean
    assert count(db, schema) == 100


def test_a_job_refused_in_the_callers_transaction_leaves_it_usable(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    with psycopg.connect(dsn) as conn:
        first = app.enqueue("effect", {"key": "kept"}, conn=conn)
        with pytest.raises(forklift.ArgumentError):
            app.enqueue_many(
                [("effect", {"key": "a"}), ("effect", {"key": float("inf")})], conn=conn
            )
        conn.commit()  # nothing of the refused batch was sent: the transaction is intact
    assert db.execute(f"SELECT args->>'key' FROM {schema}.jobs").fetchall() == [("kept",)]
    assert first > 0


def _cli_enqueue(env: dict[str, str], args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "forklift", "enqueue", "tests.apps.basic:app", "effect"]
    return subprocess.run(
        [*command, "--args", args], env=env, capture_output=True, text=True, timeout=60
    )


def test_every_way_to_enqueue_refuses_args_over_the_cap_and_inserts_nothing(
    app: forklift.App,
    db: psycopg.Connection[Any],
    schema: str,
    env: dict[str, str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(app, "max_arg_bytes", 1000, raising=False)
    big = {"key": "x" * 1000}
    small = {"key": "y"}
    over = r"more than the 1,000 a job may take \(App\(max_arg_bytes=\.\.\.\)"

    async def in_a_transaction(call: Any) -> None:
        async with await psycopg.AsyncConnection.connect(db.info.dsn) as conn:
            await call(conn)

    def batch_writer() -> None:
        with app.batch() as b:
            b.enqueue("effect", **big)

    paths: dict[str, Any] = {
        "enqueue": lambda: app.enqueue("effect", big),
        "task.enqueue": lambda: basic.effect.enqueue(key=big["key"]),
        "enqueue with conn": lambda: app.enqueue("effect", big, conn=db),
        "enqueue_many": lambda: app.enqueue_many([("effect", small)] * 3 + [("effect", big)]),
        "enqueue_many with conn": lambda: app.enqueue_many(
            [("effect", small), forklift.JobSpec("effect", big)], conn=db
        ),
        "enqueue_async": lambda: asyncio.run(app.enqueue_async("effect", big)),
        "enqueue_async with conn": lambda: asyncio.run(
            in_a_transaction(lambda c: app.enqueue_async("effect", big, conn=c))
        ),
        "enqueue_many_async": lambda: asyncio.run(
            app.enqueue_many_async([("effect", small), ("effect", big)])
        ),
        "enqueue_batch": lambda: app.enqueue_batch([("effect", small), ("effect", big)]),
        "batch writer": batch_writer,
        "batch callback args": lambda: app.enqueue_batch(
            [("effect", small)], on_complete="effect", on_complete_args=big
        ),
    }
    accepted = []
    for name, call in paths.items():
        try:
            call()
            accepted.append(name)
        except forklift.ArgumentError as exc:
            assert re.search(over, str(exc)), f"{name}: {exc}"
    cli = _cli_enqueue({**env, "FORKLIFT_MAX_ARG_BYTES": "1000"}, json.dumps(big))
    if cli.returncode == 0:
        accepted.append("forklift enqueue")
    else:
        assert "more than the 1,000 a job may take" in cli.stderr, cli.stderr
    assert accepted == []
    assert count(db, schema, f"args->>'key' = '{big['key']}'") == 0
    # Within the cap, every way still enqueues.
    app.enqueue("effect", {"key": "z" * 900})
    assert _cli_enqueue(env, json.dumps({"key": "w" * 5000})).returncode == 0


def test_app_enqueue_takes_every_option_enqueue_async_takes(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, env: dict[str, str]
) -> None:
    command = [sys.executable, "-m", "forklift", "enqueue", "tests.apps.basic:app", "noop"]
    options = ["--max-crashes", "5", "--max-attempts", "7"]
    cli = subprocess.run([*command, *options], env=env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    ids = [
        int(cli.stdout),
        app.enqueue("noop", max_crashes=5, max_attempts=7),
        basic.noop.enqueue(max_crashes=5, max_attempts=7),
        asyncio.run(app.enqueue_async("noop", max_crashes=5, max_attempts=7)),
        asyncio.run(basic.noop.enqueue_async(max_crashes=5, max_attempts=7)),
        *app.enqueue_many([forklift.JobSpec("noop", {}, max_crashes=5, max_attempts=7)]),
    ]
    rows = db.execute(
        f"SELECT max_crashes, max_attempts FROM {schema}.jobs WHERE id = ANY(%s)", (ids,)
    ).fetchall()
    assert rows == [(5, 7)] * 6


def test_registering_a_name_twice_is_refused(app: forklift.App) -> None:
    with pytest.raises(forklift.ConfigError, match="twice"):
        app.task(name="noop")(lambda ctx: None)


def _slow_inserts(db: psycopg.Connection[Any], schema: str, per_row: float) -> None:
    """Each row inserted into the jobs table takes `per_row` seconds more (a row trigger),
    so a statement's time grows with its rows whatever the machine's speed."""
    db.execute(
        f"""CREATE FUNCTION {schema}.slow() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF NEW.idempotency_key = 'boom' THEN RAISE EXCEPTION 'boom: refused'; END IF;
            PERFORM pg_sleep({per_row});
            RETURN NEW;
        END $$"""
    )
    db.execute(
        f"CREATE TRIGGER slow BEFORE INSERT ON {schema}.jobs FOR EACH ROW EXECUTE FUNCTION "
        f"{schema}.slow()"
    )


def test_a_keyed_enqueue_many_longer_than_the_statement_timeout_goes_in_whole(
    app: forklift.App, dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    existing = [app.enqueue("noop", idempotency_key=f"k{n}") for n in range(0, 1000, 100)]
    # 1,200 rows: over 2.4 s in one statement; 20 rows a statement, well under the 1 s.
    _slow_inserts(db, schema, 0.002)
    app.store.inserts.chunk = 20
    specs: list[forklift.JobSpec | tuple[str, dict[str, Any]]] = [
        forklift.JobSpec("effect", {"key": str(n)}, idempotency_key=f"k{n}") for n in range(1000)
    ]
    specs += [forklift.JobSpec("effect", {"key": "again"}, idempotency_key="k555")]
    specs += [("effect", {"key": f"plain{n}"}) for n in range(150)]  # COPY, 8 statements
    specs += [forklift.JobSpec("effect", {"key": f"later{n}"}, delay=60) for n in range(50)]
    with psycopg.connect(dsn) as conn:
        conn.execute("SET statement_timeout = '1s'")
        ids = app.enqueue_many(specs, conn=conn)
        conn.commit()
    assert len(ids) == len(specs) == 1201
    assert ids[:1000:100] == existing
    assert ids[1000] == ids[555]
    assert len(set(ids)) == 1200  # 1,000 keys (10 taken before) + 150 + 50
    args = dict(db.execute(f"SELECT id, args->>'key' FROM {schema}.jobs").fetchall())
    assert len(args) == 1200
    for i, spec in enumerate(specs):
        if i % 100 and i != 1000:  # not a key that was taken before this batch
            wanted = spec.args["key"] if isinstance(spec, forklift.JobSpec) else spec[1]["key"]
            assert args[ids[i]] == wanted, i


def test_a_chunked_enqueue_many_that_fails_late_inserts_nothing(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    _slow_inserts(db, schema, 0.0)
    app.store.inserts.chunk = 100
    keyed = [
        forklift.JobSpec("effect", {"key": str(n)}, idempotency_key=f"k{n}") for n in range(950)
    ]
    specs: list[forklift.JobSpec | tuple[str, dict[str, Any]]] = [*keyed]
    specs += [("effect", {"key": "p"}) for _ in range(300)]
    specs += [forklift.JobSpec("effect", {"key": "x"}, idempotency_key="boom")]  # 13th chunk
    with pytest.raises(forklift.DatabaseError, match="boom: refused"):
        app.enqueue_many(specs)
    assert count(db, schema) == 0


def _heard(listener: psycopg.Connection[Any], n: int, timeout: float = 2.0) -> list[str]:
    return [x.payload for x in listener.notifies(timeout=timeout, stop_after=n)]


def test_an_enqueue_on_the_producers_connection_wakes_its_queues_after_the_commit(
    app: forklift.App, dsn: str, schema: str
) -> None:
    """Migration 0010: the insert commits quietly and the notifier notifies after it, one
    notification per queue of a bulk enqueue."""
    app.enqueue("noop")  # the producer's pool is open before we listen
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{schema}_jobs"')
        app.enqueue("noop", queue="mail")
        assert _heard(listener, 1) == ["mail"]
        app.enqueue_many([forklift.JobSpec("noop", {}, queue=q) for q in ("a", "b", "a", "c")])
        assert sorted(_heard(listener, 3)) == ["a", "b", "c"]
        assert _heard(listener, 1, timeout=0.3) == []  # and no more than that


def test_an_enqueue_in_the_callers_transaction_wakes_at_its_commit_and_not_before(
    app: forklift.App, dsn: str, schema: str
) -> None:
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn) as conn,
    ):
        listener.execute(f'LISTEN "{schema}_jobs"')
        app.enqueue("noop", queue="mail", conn=conn)
        app.enqueue_many([forklift.JobSpec("noop", {}, queue="bulk")], conn=conn)
        assert _heard(listener, 1, timeout=0.3) == []
        conn.commit()
        assert sorted(_heard(listener, 2)) == ["bulk", "mail"]


def test_an_insert_by_plain_sql_still_wakes_its_queue_and_quiet_does_not_outlive_an_enqueue(
    app: forklift.App, dsn: str, schema: str
) -> None:
    """An operator's own INSERT notifies as before; an enqueue's quiet mark ends with its
    transaction, so the next insert on the same connection notifies again."""
    from forklift.store import _steps

    store = app.store
    with (
        psycopg.connect(dsn, autocommit=True) as listener,
        psycopg.connect(dsn, autocommit=True) as conn,
    ):
        listener.execute(f'LISTEN "{schema}_jobs"')
        job = app._new_job("noop", {}, queue="quiet")
        _steps.run(store.inserts.one(job, quiet=True), conn, store.pool.connection)
        assert _heard(listener, 1, timeout=0.3) == []  # quiet: nobody woke it
        conn.execute(
            f"INSERT INTO {schema}.jobs (queue, task, args) VALUES ('sql', 'noop', '{{}}')"
        )
        assert _heard(listener, 1) == ["sql"]


def test_a_full_queue_refuses_many_concurrent_producers_at_once(
    app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Eight threads enqueue at once into a full queue, on a producer pool of 4: each is
    refused with QueueFull at once (none waits for a second connection while holding
    one), and every refusal is counted."""
    import threading
    import time

    from forklift.testing import wait_for

    db.execute(
        f"INSERT INTO {schema}.limits (scope, name, max_depth) VALUES ('queue', 'default', 1)"
    )
    app.enqueue("noop")
    barrier = threading.Barrier(8)
    outcomes: list[tuple[str, float]] = []

    def produce(bulk: bool) -> None:
        barrier.wait()
        began = time.monotonic()
        try:
            if bulk:
                app.enqueue_many([("noop", {}), ("noop", {})])
            else:
                app.enqueue("noop")
            outcomes.append(("enqueued", time.monotonic() - began))
        except Exception as exc:
            outcomes.append((type(exc).__name__, time.monotonic() - began))

    threads = [threading.Thread(target=produce, args=(i % 2 == 0,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    kinds = sorted(kind for kind, _ in outcomes)
    slowest = max(took for _, took in outcomes)
    assert kinds == ["QueueFull"] * 8 and slowest < 2.0, f"{kinds}, slowest {slowest:.1f} s"
    wait_for(
        lambda: db.execute(f"SELECT rejected FROM {schema}.limits").fetchone() == (12,),
        what="every refused job counted",
    )
