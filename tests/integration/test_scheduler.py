"""The scheduler's rounds against a real PostgreSQL, on a fake clock.

Several Scheduler instances in one process stand for replicas: each has its own store
(its own connections), and `run_once(now)` is one round at the time a test chooses.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.scheduler.config import SchedulerConfig
from forklift.scheduler.metrics import CronCollector
from forklift.scheduler.service import FireOutcome, Round, Scheduler
from forklift.scheduler.store import ScheduleRow, ScheduleStore

# A fake clock near the real one, on a whole minute (so jobs due "now" really are).
T0 = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(hours=1)
Conn = psycopg.Connection[Any]


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ticking_app(dsn: str, schema: str, **options: Any) -> forklift.App:
    app = forklift.App(dsn, schema=schema)

    @app.task
    def tick(ctx: forklift.JobContext, *, n: int = 0) -> None:
        pass

    options.setdefault("every", 1)
    app.periodic(task=tick, name="tick", **options)
    return app


Replicas = Callable[..., list[Scheduler]]


@pytest.fixture
def replicas(dsn: str, schema: str) -> Replicas:
    def make(n: int, app: forklift.App | None = None, **options: Any) -> list[Scheduler]:
        app = app or ticking_app(dsn, schema, **options)
        return [
            Scheduler(ScheduleStore(dsn, schema, _db.Timeouts()), app.schedules.values())
            for _ in range(n)
        ]

    return make


def fired(db: Conn, schema: str) -> list[datetime]:
    """The fire times that have a job: each job's run time, checked against its key."""
    rows = db.execute(
        f"SELECT idempotency_key, available_at FROM {schema}.jobs ORDER BY available_at"
    ).fetchall()
    for key, available in rows:
        assert key == f"forklift:schedule:tick:{available.astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    return [available for _, available in rows]


def schedule_row(dsn: str, schema: str, name: str = "tick") -> ScheduleRow:
    rows = ScheduleStore(dsn, schema, _db.Timeouts()).schedule_list()
    return next(r for r in rows if r.name == name)


def seconds(times: Sequence[datetime]) -> list[int]:
    return [int((t - T0).total_seconds()) for t in times]


def total(rounds: Sequence[Round], outcome: FireOutcome) -> int:
    return sum(r.outcomes("tick").get(outcome, 0) for r in rounds)


# -- exactly once across replicas --------------------------------------------------------


def test_three_replicas_enqueue_one_job_per_fire_time(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    three = replicas(3)
    rounds = [s.run_once(at(t / 2)) for t in range(40) for s in three]  # 20 s, 0.5 s apart
    assert seconds(fired(db, schema)) == list(range(1, 23))  # to 19.5 s + 3 s ahead
    assert total(rounds, FireOutcome.ENQUEUED) == 22
    assert total(rounds, FireOutcome.SKIPPED_MISFIRE) == 0


def test_replicas_racing_in_threads_still_enqueue_each_fire_time_once(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    five = replicas(5)
    rounds: list[Round] = []
    for step in range(10):
        now = at(step)
        start = threading.Barrier(len(five))

        def go(s: Scheduler, now: datetime = now, start: threading.Barrier = start) -> None:
            start.wait()
            rounds.append(s.run_once(now))

        threads = [threading.Thread(target=go, args=(s,)) for s in five]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
    assert seconds(fired(db, schema)) == list(range(1, 13))
    assert total(rounds, FireOutcome.ENQUEUED) == 12  # the others were no-ops


def test_a_replica_that_is_down_is_covered_by_the_others(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    a, b, c = replicas(3)
    for t in range(10):
        for s in (a, b, c) if t < 4 else (b, c):  # a dies at 4 s
            s.run_once(at(t + 0.25))
    assert seconds(fired(db, schema)) == list(range(1, 13))


def test_jobs_are_enqueued_ahead_to_run_at_their_fire_time(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=60)
    s.run_once(at(56.5))
    assert seconds(fired(db, schema)) == []
    s.run_once(at(57.5))  # within the 3 s margin
    assert seconds(fired(db, schema)) == [60]
    assert s.config == SchedulerConfig()


# -- misfires ----------------------------------------------------------------------------


def test_after_downtime_the_most_recent_missed_fire_time_runs_once(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10)
    s.run_once(at(0))  # declared: nothing due within the 3 s margin yet
    s.run_once(at(8))  # enqueues 10
    after = s.run_once(at(75.5))  # down from 8 s to 75.5 s: 20 ... 70 missed
    assert seconds(fired(db, schema)) == [10, 70]
    assert after.outcomes("tick") == {FireOutcome.ENQUEUED: 1, FireOutcome.SKIPPED_MISFIRE: 5}
    s.run_once(at(77.5))
    assert seconds(fired(db, schema)) == [10, 70, 80]


def test_with_catchup_every_missed_fire_time_in_the_window_runs(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10, catchup=timedelta(seconds=45))
    s.run_once(at(8))
    after = s.run_once(at(75.5))  # the window reaches back to 30.5 s
    assert seconds(fired(db, schema)) == [10, 40, 50, 60, 70]
    assert after.outcomes("tick") == {FireOutcome.ENQUEUED: 4, FireOutcome.SKIPPED_MISFIRE: 2}


def test_a_changed_definition_starts_afresh_without_the_old_ones_misses(
    dsn: str, db: Conn, schema: str, replicas: Replicas
) -> None:
    (old,) = replicas(1, every=10, catchup=3600)
    old.run_once(at(8))
    (new,) = replicas(1, ticking_app(dsn, schema, every=10, catchup=3600, args={"n": 1}))
    new.run_once(at(75.5))  # a catch-up of the old definition would enqueue 20 ... 70
    assert seconds(fired(db, schema)) == [10]
    new.run_once(at(78))
    assert seconds(fired(db, schema)) == [10, 80]
    row = schedule_row(dsn, schema)
    assert row.definition_hash == new.schedules[0].definition_hash
    assert row.defined_at == at(75.5)


def test_a_schedule_removed_from_the_code_stops_firing(
    dsn: str, db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1)
    s.run_once(at(0))
    s.use([])  # the reloaded app no longer declares it
    s.run_once(at(10))
    assert seconds(fired(db, schema)) == [1, 2, 3]
    assert schedule_row(dsn, schema).next_fire_at == at(1)  # as last synced


# -- overlap -----------------------------------------------------------------------------


def set_state(db: Conn, schema: str, fire: float, state: str) -> None:
    owner = "someone" if state == "running" else None
    db.execute(
        f"UPDATE {schema}.jobs SET state = %s, lease_owner = %s,"
        " completed_at = CASE WHEN %s IN ('succeeded', 'dead') THEN now() END,"
        " last_error = CASE WHEN %s = 'dead' THEN 'RuntimeError: boom' END"
        " WHERE available_at = %s",
        (state, owner, state, state, at(fire)),
    )


def test_without_overlap_a_fire_is_skipped_while_the_previous_job_runs(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10, overlap=False)
    s.run_once(at(8))
    set_state(db, schema, 10, "running")
    assert s.run_once(at(18)).outcomes("tick") == {}  # 20 not enqueued ahead: 10 may end
    assert seconds(fired(db, schema)) == [10]
    skipped = s.run_once(at(20))  # its time has come, and 10 still runs
    assert skipped.outcomes("tick") == {FireOutcome.SKIPPED_OVERLAP: 1}
    set_state(db, schema, 10, "succeeded")
    s.run_once(at(28))
    assert seconds(fired(db, schema)) == [10, 30]


def test_without_overlap_only_one_fire_waits_ahead_and_the_next_follows_when_it_ends(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=1, overlap=False)
    s.run_once(at(0.5))  # 1, 2 and 3 within the 3 s margin: only 1 goes in ahead
    assert seconds(fired(db, schema)) == [1]
    s.run_once(at(0.9))
    assert seconds(fired(db, schema)) == [1]  # 2 still waits for 1
    set_state(db, schema, 1, "succeeded")
    assert s.run_once(at(1.5)).outcomes("tick") == {FireOutcome.ENQUEUED: 1}
    assert seconds(fired(db, schema)) == [1, 2]  # 2 ahead, on time
    set_state(db, schema, 2, "running")
    assert s.run_once(at(3)).outcomes("tick") == {FireOutcome.SKIPPED_OVERLAP: 1}  # 3
    set_state(db, schema, 2, "succeeded")
    assert s.run_once(at(3.5)).outcomes("tick") == {FireOutcome.ENQUEUED: 1}  # 4, ahead
    assert seconds(fired(db, schema)) == [1, 2, 4]
    assert s.counted().get(("tick", FireOutcome.SKIPPED_MISFIRE), 0) == 0


def test_with_overlap_a_fire_is_enqueued_whatever_the_previous_job_does(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10)
    s.run_once(at(8))
    set_state(db, schema, 10, "running")
    s.run_once(at(18))
    assert seconds(fired(db, schema)) == [10, 20]


# -- outcomes ----------------------------------------------------------------------------


def test_finished_jobs_are_recorded_on_their_schedule(
    dsn: str, db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10)
    s.run_once(at(8))
    s.run_once(at(18))
    row = schedule_row(dsn, schema)
    assert (row.last_fire_at, row.in_flight) == (at(10), 2)  # 20 not due yet
    assert row.last_success_at is None and row.last_error is None
    set_state(db, schema, 10, "succeeded")
    assert s.run_once(at(21)).settled == 1
    row = schedule_row(dsn, schema)
    assert (row.last_fire_at, row.in_flight) == (at(20), 1)  # 20 running or waiting
    assert row.last_success_at is not None and row.last_error is None
    set_state(db, schema, 20, "dead")
    s.run_once(at(22))
    row = schedule_row(dsn, schema)
    assert row.last_error == "RuntimeError: boom"
    assert row.last_error_at is not None and row.last_success_at is not None
    assert row.last_error_at >= row.last_success_at
    last_job = db.execute(f"SELECT id FROM {schema}.jobs WHERE available_at = %s", (at(20),))
    assert row.last_job_id == last_job.fetchone()[0]  # type: ignore[index]


def test_a_round_counts_what_it_did_for_the_metrics(schema: str, replicas: Replicas) -> None:
    a, b = replicas(2, every=10)
    a.run_once(at(8))
    b.run_once(at(75.5))
    assert a.counted() == {("tick", FireOutcome.ENQUEUED): 1}
    assert b.counted() == {
        ("tick", FireOutcome.ENQUEUED): 1,
        ("tick", FireOutcome.SKIPPED_MISFIRE): 5,
    }


def test_misses_outside_the_catchup_window_are_counted_even_with_nothing_to_enqueue(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=60, catchup=10)
    s.run_once(at(58))  # enqueues 60
    later = s.run_once(at(200))  # 120 and 180 missed, outside the 10 s window
    assert later.outcomes("tick") == {FireOutcome.SKIPPED_MISFIRE: 2}
    assert s.run_once(at(201)).outcomes("tick") == {}  # counted once
    assert seconds(fired(db, schema)) == [60]


# -- metrics -----------------------------------------------------------------------------


def gauge(collector: CronCollector, name: str) -> dict[str, float]:
    family = next(m for m in collector.collect() if m.name == name)
    return {s.labels["schedule"]: s.value for s in family.samples}


def test_metrics_show_declared_schedules_last_success_or_first_declaration(
    dsn: str, db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10)
    collector = CronCollector(s)
    s.run_once(at(8))
    created = schedule_row(dsn, schema).created_at.timestamp()
    assert gauge(collector, "forklift_cron_last_success_timestamp_seconds") == {"tick": created}
    assert gauge(collector, "forklift_cron_interval_seconds") == {"tick": 10.0}
    fires = next(m for m in collector.collect() if m.name == "forklift_cron_fires")
    assert [(x.labels, x.value) for x in fires.samples if x.name.endswith("_total")] == [
        ({"schedule": "tick", "outcome": "enqueued"}, 1.0)
    ]
    set_state(db, schema, 10, "succeeded")
    s.run_once(at(11))
    success = schedule_row(dsn, schema).last_success_at
    assert success is not None
    collector._read_at = float("-inf")  # past the cache
    assert gauge(collector, "forklift_cron_last_success_timestamp_seconds") == {
        "tick": success.timestamp()
    }
    s.use([])  # removed from the code: no series to alert on
    assert gauge(collector, "forklift_cron_last_success_timestamp_seconds") == {}


# -- the scheduler's idempotency keys -----------------------------------------------------


def test_a_producer_cannot_enqueue_with_a_key_of_forklifts_own(
    dsn: str, db: Conn, schema: str, env: dict[str, str]
) -> None:
    app = ticking_app(dsn, schema)
    key = f"forklift:schedule:tick:{at(10):%Y-%m-%dT%H:%M:%SZ}"
    with pytest.raises(forklift.ArgumentError, match="reserves"):
        app.enqueue("tick", idempotency_key=key)
    with pytest.raises(forklift.ArgumentError, match="reserves"):
        app.tasks["tick"].enqueue(idempotency_key="forklift:anything")
    with pytest.raises(forklift.ArgumentError, match="reserves"):
        app.enqueue_many([forklift.JobSpec("tick", {}, idempotency_key=key)])
    result = subprocess.run(
        [sys.executable, "-m", "forklift", "enqueue", "tests.apps.scheduled:app", "tick",
         "--key", key],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert result.returncode != 0 and "reserves" in result.stderr, result.stderr
    assert app.enqueue("tick", idempotency_key="my:forklift:key") > 0  # only the prefix
    count = db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()
    assert count == (1,)


def test_a_row_written_with_a_fires_key_does_not_stop_the_fire(
    db: Conn, schema: str, replicas: Replicas
) -> None:
    (s,) = replicas(1, every=10)
    key = f"forklift:schedule:tick:{at(10).astimezone(UTC):%Y-%m-%dT%H:%M:%SZ}"
    db.execute(
        f"INSERT INTO {schema}.jobs (task, idempotency_key, available_at)"
        " VALUES ('other', %s, now() + interval '1 day')",
        (key,),
    )
    assert s.run_once(at(8)).outcomes("tick") == {FireOutcome.ENQUEUED: 1}
    rows = db.execute(
        f"SELECT available_at, idempotency_key FROM {schema}.jobs WHERE task = 'tick'"
    ).fetchall()
    assert rows == [(at(10), None)]  # enqueued all the same, without the taken key
    assert s.run_once(at(9)).outcomes("tick") == {}  # and once: in flight, not again
    set_state(db, schema, 10, "succeeded")
    s.run_once(at(11))  # settled: its fire row is gone, fired_through still past it
    assert db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE task = 'tick'").fetchone() == (1,)
