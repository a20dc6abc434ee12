"""app.singleton(): one holder across every caller, never blocking, always released."""

from __future__ import annotations

import os
import resource
import threading
import time
from typing import Any

import psycopg
import pytest

import forklift
from forklift._locks import lock_key
from forklift.testing import wait_for

CALLERS = 5


def lock_is_held(db: psycopg.Connection[Any], schema: str, name: str) -> bool:
    key = lock_key(f"singleton:{schema}:{name}")
    row = db.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"
        " AND ((classid::bigint << 32) | objid::bigint) = %s",
        (key,),
    ).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("winner_raises", [False, True], ids=["returns", "raises"])
def test_five_concurrent_callers_one_runs_four_skip_and_the_lock_is_free_after(
    dsn: str, db: psycopg.Connection[Any], schema: str, winner_raises: bool
) -> None:
    app = forklift.App(dsn, schema=schema)
    everyone_tried = threading.Barrier(CALLERS)  # the winner holds until all have tried
    ran: list[int] = []
    skipped: list[int] = []
    raised: list[BaseException] = []
    held_while_running: list[bool] = []

    def caller(i: int) -> None:
        try:
            with app.singleton("rebuild-cache") as acquired:
                if acquired:
                    ran.append(i)
                    everyone_tried.wait(timeout=20)
                    held_while_running.append(lock_is_held(db, schema, "rebuild-cache"))
                    if winner_raises:
                        raise RuntimeError("the work failed")
                else:
                    skipped.append(i)
                    everyone_tried.wait(timeout=20)
        except RuntimeError as exc:
            raised.append(exc)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(CALLERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(ran) == 1 and len(skipped) == CALLERS - 1
    assert held_while_running == [True]
    assert [str(e) for e in raised] == (["the work failed"] if winner_raises else [])
    assert not lock_is_held(db, schema, "rebuild-cache")
    with app.singleton("rebuild-cache") as again:
        assert again


def test_a_singleton_section_is_per_schema_and_per_name(dsn: str, schema: str) -> None:
    app = forklift.App(dsn, schema=schema)
    other = forklift.App(dsn, schema=f"{schema}_b")
    with app.singleton("a") as first, app.singleton("b") as second, other.singleton("a") as third:
        assert first and second and third
        with app.singleton("a") as nested:
            assert not nested


def test_the_work_is_left_alone_when_it_raises_a_database_error(dsn: str, schema: str) -> None:
    app = forklift.App(dsn, schema=schema)
    with pytest.raises(psycopg.errors.UndefinedTable), app.singleton("x") as acquired:
        assert acquired
        with psycopg.connect(dsn) as conn:
            conn.execute("SELECT * FROM no_such_table")


def test_a_bad_name_is_refused(dsn: str, schema: str) -> None:
    app = forklift.App(dsn, schema=schema)
    with pytest.raises(forklift.ArgumentError, match="control character"):
        app.singleton("a\nb")


def test_another_holder_is_a_debug_line_not_a_warning(
    dsn: str, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = forklift.App(dsn, schema=schema)
    caplog.set_level("DEBUG", logger="forklift")
    with app.singleton("x"), app.singleton("x") as acquired:
        assert not acquired
    busy = [r for r in caplog.records if getattr(r, "event", "") == "singleton.busy"]
    assert [r.levelname for r in busy] == ["DEBUG"]
    assert not [r for r in caplog.records if r.levelno >= 30]


def holder_pid(db: psycopg.Connection[Any], schema: str, name: str) -> int:
    key = lock_key(f"singleton:{schema}:{name}")
    row = db.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
        " AND ((classid::bigint << 32) | objid::bigint) = %s",
        (key,),
    ).fetchone()
    assert row is not None, "nobody holds the lock"
    return int(row[0])


def test_a_terminated_session_turns_the_holder_false_within_a_second(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    app = forklift.App(dsn, schema=schema)
    with app.singleton("long") as held:
        assert held
        db.execute("SELECT pg_terminate_backend(%s)", (holder_pid(db, schema, "long"),))
        terminated = time.monotonic()
        wait_for(lambda: not held, timeout=5, what="the holder told it lost the lock")
        noticed = time.monotonic() - terminated
        assert noticed < 1.0, f"it took {noticed:.2f}s to notice"
        assert held.lost and not held.held and held.acquired
        with app.singleton("long") as second:  # the lock is free: another may enter now
            assert second
    # Leaving the block after the loss neither raises nor leaves anything held.
    assert not lock_is_held(db, schema, "long")


def test_a_check_raises_singleton_lost_once_lost(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    app = forklift.App(dsn, schema=schema)
    with app.singleton("long") as held, app.singleton("long") as busy:
        held.check()  # held: nothing raised
        assert not busy and not busy.lost
        with pytest.raises(forklift.SingletonLost, match="held by another process"):
            busy.check()
        db.execute("SELECT pg_terminate_backend(%s)", (holder_pid(db, schema, "long"),))
        assert held.wait_lost(timeout=5)
        with pytest.raises(forklift.SingletonLost, match="another holder may be inside"):
            held.check()


def test_a_block_that_checks_stops_within_a_second_of_a_second_holder_entering(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    """The chaos probe's case: the first holder's session is terminated mid-block while
    a contender keeps trying; the first block, checking between 20 ms steps, has
    stopped within a second of the contender's entry (it ran on for its whole length)."""
    app = forklift.App(dsn, schema=schema)
    inside = threading.Event()
    first_stopped: list[float] = []
    second_entered: list[float] = []
    stop_trying = threading.Event()

    def first() -> None:
        with app.singleton("chaos") as held:
            assert held
            inside.set()
            deadline = time.monotonic() + 6
            while held and time.monotonic() < deadline:
                time.sleep(0.02)  # one step of the block's work
            first_stopped.append(time.monotonic())

    def contender() -> None:
        while not stop_trying.is_set():
            with app.singleton("chaos") as got:
                if got:
                    second_entered.append(time.monotonic())
                    return
            time.sleep(0.02)

    holder = threading.Thread(target=first)
    holder.start()
    assert inside.wait(10)
    other = threading.Thread(target=contender)
    other.start()
    db.execute("SELECT pg_terminate_backend(%s)", (holder_pid(db, schema, "chaos"),))
    holder.join(timeout=20)
    other.join(timeout=10)
    stop_trying.set()
    assert second_entered and first_stopped
    overlap = first_stopped[0] - second_entered[0]
    assert overlap < 1.0, f"both were inside for {overlap:.2f}s"


def test_the_watcher_keeps_the_lock_in_a_process_with_many_descriptors(
    dsn: str, schema: str
) -> None:
    """select() refuses a descriptor past 1023: the watcher must not read that as a
    lost session."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"at most {hard} descriptors here")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    spare = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        app = forklift.App(dsn, schema=schema)
        with app.singleton("busy-process") as held:
            assert held
            assert not held.wait_lost(timeout=1.2)  # two checks, both fine
            assert held
    finally:
        for fd in spare:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
