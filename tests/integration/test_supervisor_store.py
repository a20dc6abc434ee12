"""The supervisor's store against a real PostgreSQL: charging and releasing a dead owner's jobs."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db, _locks
from forklift.supervisor.store import SupervisorStore
from forklift.testing import wait_for
from tests.integration.conftest import let_go

DEAD = "gone:1:a"


@pytest.fixture
def producer(dsn: str, schema: str) -> Iterator[forklift.App]:
    app = forklift.App(dsn, schema=schema)
    yield app
    app.close()


@pytest.fixture
def store(dsn: str, schema: str) -> SupervisorStore:
    return SupervisorStore(dsn, schema, _db.Timeouts())


def leased(
    db: psycopg.Connection[Any],
    schema: str,
    producer: forklift.App,
    *,
    attempts: int,
    max_attempts: int = 10,
    owner: str = DEAD,
    queue: str = "default",
) -> int:
    """A job running under `owner` in its attempt number `attempts`."""
    job_id = producer.enqueue("noop", queue=queue, max_attempts=max_attempts)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = %s, lease_owner = %s,"
        " lease_until = now() + interval '1 hour' WHERE id = %s",
        (attempts, owner, job_id),
    )
    return job_id


def retry_delay(db: psycopg.Connection[Any], schema: str, job_id: int) -> float:
    """Seconds from the charge (its error's timestamp) to the job's next availability."""
    row = db.execute(
        f"SELECT extract(epoch FROM available_at - (errors->-1->>'at')::timestamptz)::float8"
        f" FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


def test_a_death_is_charged_with_the_delay_each_attempt_earns(
    db: psycopg.Connection[Any], schema: str, producer: forklift.App, store: SupervisorStore
) -> None:
    ids = {n: leased(db, schema, producer, attempts=n) for n in (0, 1, 2, 3, 9)}
    exhausted = leased(db, schema, producer, attempts=3, max_attempts=3)
    bystander = leased(db, schema, producer, attempts=1, owner="alive:2:b")
    charged = store.job_fail_orphaned(DEAD, "WorkerDied: worker process killed by SIGKILL")
    assert sorted(j.id for j in charged) == sorted([*ids.values(), exhausted])
    states = {j.id: (j.state, j.attempts, j.queue, j.task) for j in charged}
    assert states[exhausted] == ("dead", 3, "default", "noop")
    # Never at once (a job that crashed one worker would crash the next within
    # milliseconds): least(60, 0.5 * 2^(attempts - 1)), the first attempt's 0.5 s.
    for attempts, job_id in ids.items():
        assert states[job_id][0] == "ready"
        expected = min(60.0, 0.5 * 2 ** (max(attempts, 1) - 1))
        assert retry_delay(db, schema, job_id) == pytest.approx(expected)
    row = db.execute(
        f"SELECT lease_owner, last_error, errors->-1->>'worker' FROM {schema}.jobs WHERE id = %s",
        (ids[1],),
    ).fetchone()
    assert row == (None, "WorkerDied: worker process killed by SIGKILL", DEAD)
    dead = db.execute(
        f"SELECT completed_at IS NOT NULL FROM {schema}.jobs WHERE id = %s", (exhausted,)
    ).fetchone()
    assert dead == (True,)
    # The fence: another owner's job is untouched.
    owner = db.execute(f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", (bystander,))
    assert owner.fetchone() == ("alive:2:b",)
    assert store.job_fail_orphaned(DEAD, "again") == []


def test_a_timeout_charges_only_the_overdue_job(
    db: psycopg.Connection[Any], schema: str, producer: forklift.App, store: SupervisorStore
) -> None:
    overdue = leased(db, schema, producer, attempts=2)
    other = leased(db, schema, producer, attempts=1)
    charged = store.job_fail_orphaned(DEAD, "TimeoutError: job timed out", ids=[overdue])
    assert [(j.id, j.state) for j in charged] == [(overdue, "ready")]
    assert retry_delay(db, schema, overdue) == pytest.approx(1.0)  # its 2nd attempt's
    state = db.execute(f"SELECT state FROM {schema}.jobs WHERE id = %s", (other,)).fetchone()
    assert state == ("running",)


def test_charging_and_releasing_wake_the_queues_listeners(
    dsn: str,
    db: psycopg.Connection[Any],
    schema: str,
    producer: forklift.App,
    store: SupervisorStore,
) -> None:
    leased(db, schema, producer, attempts=1, queue="render")
    leased(db, schema, producer, attempts=1, queue="mail", owner="other:3:c")
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f'LISTEN "{schema}_jobs"')
        store.job_fail_orphaned(DEAD, "WorkerDied")
        released = store.job_release_owner("other:3:c")
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=2.0, stop_after=2)]
    assert heard == [(f"{schema}_jobs", "render"), (f"{schema}_jobs", "mail")]
    assert [j.queue for j in released] == ["mail"]
    row = db.execute(
        f"SELECT state, attempts, lease_owner FROM {schema}.jobs WHERE id = %s", (released[0].id,)
    ).fetchone()
    assert row == ("ready", 0, None)


def test_owners_without_their_liveness_lock_are_found_and_only_they_charged(
    dsn: str,
    db: psycopg.Connection[Any],
    schema: str,
    store: SupervisorStore,
    producer: forklift.App,
) -> None:
    alive, gone = "here:1:alive", "there:2:gone"
    kept = leased(db, schema, producer, attempts=1, owner=alive)
    lost = leased(db, schema, producer, attempts=1, owner=gone)
    holder = psycopg.connect(dsn, autocommit=True)  # the live worker's lock session
    assert _locks.try_take(holder, _locks.liveness(schema, alive))
    assert store.owners_unlocked() == [gone]
    assert store.job_fail_orphaned(alive, "WorkerLost: x", retry=None, unlocked=True) == []
    (charged,) = store.job_fail_orphaned(gone, "WorkerLost: x", retry=None, unlocked=True)
    let_go(holder, db, _locks.liveness(schema, alive))
    assert charged.id == lost and charged.state == "ready"
    row = db.execute(
        f"SELECT available_at = created_at FROM {schema}.jobs WHERE id = %s", (lost,)
    ).fetchone()
    assert row == (True,)  # ready at once, in its old place in line
    # Its session gone, the live one's lock is free too: now it is found.
    assert store.owners_unlocked() == [alive]
    assert kept != lost


def test_a_worker_takes_its_liveness_lock_back_when_its_session_ends(
    dsn: str, db: psycopg.Connection[Any], schema: str
) -> None:
    from forklift.workers.liveness import LivenessConfig, LivenessLock

    lock = LivenessLock(dsn, _db.Timeouts(), schema, "here:9:w", "forklift-worker:9:w",
                        LivenessConfig(tick=0.05, ping_every=0.2))  # fmt: skip
    assert lock.run_once() and lock.held.is_set()
    store = SupervisorStore(dsn, schema, _db.Timeouts())
    name = _locks.liveness(schema, "here:9:w")
    assert _locks.held_by_anyone(db, [name]) == {name}
    db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
        " WHERE application_name = 'forklift-worker:9:w'"
    )
    wait_for(lambda: _locks.held_by_anyone(db, [name]) == set(), what="the lock gone")
    assert lock.run_once()  # noticed on its socket, taken back in the same round
    assert _locks.held_by_anyone(db, [name]) == {name}
    lock.stop()
    lock.run()  # sees the stop, lets go
    assert not lock.held.is_set()
    # The server ends the session (and its lock) a moment after the socket closes.
    wait_for(lambda: _locks.held_by_anyone(db, [name]) == set(), what="the lock let go")
    assert store.owners_unlocked() == []


def crashes_and_error(db: psycopg.Connection[Any], schema: str, job_id: int) -> tuple[Any, ...]:
    row = db.execute(
        f"SELECT state, crashes, last_error, errors->-1->>'error' FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_crash_is_counted_and_the_last_one_allowed_quarantines_the_job(
    db: psycopg.Connection[Any], schema: str, producer: forklift.App, store: SupervisorStore
) -> None:
    job_id = leased(db, schema, producer, attempts=1, max_attempts=10)
    [first] = store.job_fail_orphaned(DEAD, "WorkerDied: worker process exited with code 3")
    assert (first.state, first.quarantined) == ("ready", False)
    assert crashes_and_error(db, schema, job_id)[:2] == ("ready", 1)
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 2, lease_owner = %s,"
        " lease_until = now() + interval '1 hour' WHERE id = %s",
        (DEAD, job_id),
    )
    [second] = store.job_fail_orphaned(DEAD, "WorkerDied: worker process exited with code 3")
    assert (second.state, second.quarantined) == ("dead", True)
    state, crashes, last_error, history = crashes_and_error(db, schema, job_id)
    assert (state, crashes) == ("dead", 2)
    assert (
        last_error
        == history
        == (
            "Quarantined: crashed its worker 2 times (max_crashes 2); "
            "last: WorkerDied: worker process exited with code 3"
        )
    )


def test_a_timeout_is_not_a_crash(
    db: psycopg.Connection[Any], schema: str, producer: forklift.App, store: SupervisorStore
) -> None:
    job_id = leased(db, schema, producer, attempts=1)
    db.execute(f"UPDATE {schema}.jobs SET crashes = 1 WHERE id = %s", (job_id,))
    [charged] = store.job_fail_orphaned(DEAD, "TimeoutError: too slow", ids=[job_id], crash=False)
    assert (charged.state, charged.quarantined) == ("ready", False)
    assert crashes_and_error(db, schema, job_id)[:3] == ("ready", 1, "TimeoutError: too slow")


def test_a_silent_registry_row_is_pruned_and_charges_nothing(
    db: psycopg.Connection[Any], schema: str, producer: forklift.App, store: SupervisorStore
) -> None:
    """The registry is for display: a late heartbeat is no proof of death (before, the
    prune charged the jobs of a live supervisor whose heartbeats could not get through)."""
    job_id = leased(db, schema, producer, attempts=1)
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, heartbeat_at)"
        " VALUES (%s, 'worker', 'lost-host', 1, now() - interval '1 hour')",
        (DEAD,),
    )
    assert store.process_prune_stale(20.0) == [DEAD]
    assert crashes_and_error(db, schema, job_id)[:2] == ("running", 0)
