"""The worker's services one step at a time, against a real PostgreSQL.

Each service is built from its collaborators here, without a Worker around it: a store
on its own pool, the held-jobs ledger, the job events (their on_job_end recorded), a
wake-up. Tests call run_once() (or flush()) and look at what it returns and what it
wrote; where a service runs on its thread, they wait on its test signals.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift._singleton import singleton
from forklift.errors import DatabaseError
from forklift.metrics import Tally
from forklift.store import Claim, Completion, JobState, JobStore
from forklift.testing import wait_for
from forklift.workers.completer import Completer, CompleterConfig, Flushed
from forklift.workers.context import JobContext, Writing
from forklift.workers.events import JobEvents, Outcome
from forklift.workers.holdings import Holdings
from forklift.workers.listener import Listener, ListenerConfig
from forklift.workers.maintenance import Maintained, Maintenance, MaintenanceConfig
from forklift.workers.renewer import LeaseRenewer, Renewed, RenewerConfig
from forklift.workers.wakeup import Wakeup
from tests.integration.conftest import horizon_held

OWNER = "test-host:1:services"
TIMEOUTS = _db.Timeouts()


@dataclass
class Rig:
    """What the services of one worker share, with the job ends it reported."""

    store: JobStore
    holdings: Holdings = field(default_factory=lambda: Holdings(concurrency=4))
    wakeup: Wakeup = field(default_factory=Wakeup)
    closing: threading.Event = field(default_factory=threading.Event)
    ended: list[tuple[int, str]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.events = JobEvents(
            OWNER, self.holdings, self.wakeup, Tally(), lambda j, o: self.ended.append((j.id, o))
        )

    def claim(self, app: forklift.App, n: int = 1) -> list[JobContext]:
        """Enqueue n noop jobs and claim them as this rig's worker would."""
        app.enqueue_many([("noop", {}) for _ in range(n)])
        jobs = self.store.job_claim(["default"], OWNER, n, 30.0, expired=False)
        assert len(jobs) == n
        held = [JobContext(job, self.store) for job in jobs]
        for ctx in held:
            self.holdings.adopt(ctx)
        return held

    @contextmanager
    def running(self, loop: Callable[[], None]) -> Iterator[None]:
        """Run a service's loop on a thread for the block; then close it and join it."""
        thread = threading.Thread(target=loop, daemon=True)
        thread.start()
        try:
            yield
        finally:
            self.closing.set()
            thread.join(timeout=5)
        assert not thread.is_alive()


@contextmanager
def open_rig(dsn: str, schema: str, name: str) -> Iterator[Rig]:
    """A Rig on a pool of its own, closed after."""
    pool = _db.make_pool(dsn, TIMEOUTS, max_size=4, name=name)
    pool.open(wait=True, timeout=10)
    r = Rig(JobStore(pool, schema))
    try:
        yield r
    finally:
        r.closing.set()
        r.wakeup.close()
        pool.close()


@pytest.fixture
def rig(dsn: str, schema: str, app: forklift.App) -> Iterator[Rig]:
    with open_rig(dsn, schema, "test-services") as r:
        yield r


def state(db: psycopg.Connection[Any], schema: str, job_id: int) -> str:
    row = db.execute(f"SELECT state FROM {schema}.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def steal(db: psycopg.Connection[Any], schema: str, job_id: int) -> None:
    """Another worker takes the job over (as after an expired lease)."""
    db.execute(f"UPDATE {schema}.jobs SET lease_owner = 'thief' WHERE id = %s", (job_id,))


# -- the completer --------------------------------------------------------------------


def test_completer_flush_completes_its_own_and_reports_the_lost(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    a, b, c = rig.claim(app, 3)
    steal(db, schema, c.job_id)
    for ctx in (a, b, c):
        rig.events.returned(ctx)
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing)
    assert completer.flush([a, b, c]) == Flushed({a.job_id, b.job_id}, [c.job_id])
    assert [state(db, schema, x.job_id) for x in (a, b, c)] == [
        JobState.SUCCEEDED,
        JobState.SUCCEEDED,
        JobState.RUNNING,
    ]
    assert sorted(rig.ended) == [
        (a.job_id, Outcome.SUCCEEDED),
        (b.job_id, Outcome.SUCCEEDED),
        (c.job_id, Outcome.LEASE_LOST),
    ]
    assert len(rig.holdings) == 0 and rig.holdings.ended == 3


def test_completer_gives_up_at_once_when_closing(rig: Rig, app: forklift.App) -> None:
    (ctx,) = rig.claim(app)
    rig.store.pool.close()  # every statement now fails
    rig.closing.set()
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing)
    assert completer.flush([ctx]) == Flushed(set(), [ctx.job_id])
    assert rig.ended == [(ctx.job_id, Outcome.LEASE_LOST)]


def test_completer_thread_flushes_what_it_is_handed(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    held = rig.claim(app, 2)
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing)
    completer.flushed.enable()
    with rig.running(completer.run):
        completed: set[int] = set()
        for ctx in held:
            rig.events.returned(ctx)
            completer.submit(ctx)
        while completed != {c.job_id for c in held}:  # in one batch or two
            completed |= completer.flushed.wait().completed
        completer.stop()
    assert all(state(db, schema, c.job_id) == JobState.SUCCEEDED for c in held)


def test_with_no_claim_coming_a_success_is_written_at_once_not_after_its_linger(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """The claim loop waits for news (its last claim drained the queue): no claim will
    take the success, so lingering for one only puts its write in the way of the claim
    the next job's notification brings."""
    (held,) = rig.claim(app, 1)
    config = CompleterConfig(linger=60.0)  # a claim would have a minute to take it
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing, config)
    completer.flushed.enable()
    completer.no_claim_coming(True)
    with rig.running(completer.run):
        rig.events.returned(held)
        completer.submit(held)
        assert completer.flushed.wait(timeout=10).completed == {held.job_id}
        completer.stop()
    assert state(db, schema, held.job_id) == JobState.SUCCEEDED


def test_successes_ride_with_the_next_claim_and_come_back_if_it_fails(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A claim takes the successes queued (Completer.riding): they complete in its
    transaction, and the completer's thread does not write them too; a claim that fails
    leaves them to the thread, which writes them after its linger."""
    a, b, c = rig.claim(app, 3)
    app.enqueue("noop", {})  # for the claim to take
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing)
    completer.flushed.enable()
    with rig.running(completer.run):
        for ctx in (a, b):
            completer.submit(ctx)
            rig.events.returned(ctx)

        def claim(rows: Sequence[Completion]) -> Claim:
            return rig.store.job_claim_next(rows, ["default"], OWNER, 5, 30.0, expired=False)

        made = completer.riding(claim)
        assert made.completed == {a.job_id, b.job_id} and len(made.jobs) == 1
        assert [state(db, schema, x.job_id) for x in (a, b)] == [JobState.SUCCEEDED] * 2
        assert completer.flushed.wait(timeout=5).completed == {a.job_id, b.job_id}  # recorded

        def failing(rows: Sequence[Completion]) -> Claim:
            raise DatabaseError("claim failed: the database went away")

        completer.submit(c)
        rig.events.returned(c)
        with pytest.raises(DatabaseError):
            completer.riding(failing)
        assert completer.flushed.wait(timeout=5).completed == {c.job_id}
        completer.stop()
    assert state(db, schema, c.job_id) == JobState.SUCCEEDED
    assert sorted(o for _, o in rig.ended) == [Outcome.SUCCEEDED] * 3


def test_a_claim_that_goes_ahead_leaves_the_successes_to_be_written_right_after_it(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A claim every slot waits on goes ahead of the successes queued
    (Completer.ahead_of): they are not written in its transaction nor while it is on
    the worker's one connection, but at once after `let_go()`, not after a linger; a
    claim that fails lets them go too."""
    a, b = rig.claim(app, 2)
    app.enqueue("noop", {})  # for the claim to take
    config = CompleterConfig(linger=60.0)  # only let_go() writes them within the test
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing, config)
    completer.flushed.enable()
    with rig.running(completer.run):
        completer.submit(a)
        rig.events.returned(a)

        def claim() -> Claim:
            assert state(db, schema, a.job_id) == JobState.RUNNING  # not written before
            return Claim(rig.store.job_claim(["default"], OWNER, 1, 30.0, expired=False))

        made = completer.ahead_of(claim)
        assert len(made.jobs) == 1 and made.completed == set()
        assert state(db, schema, a.job_id) == JobState.RUNNING  # held back until let go
        completer.let_go()
        assert completer.flushed.wait(timeout=10).completed == {a.job_id}

        def failing() -> Claim:
            raise DatabaseError("claim failed: the database went away")

        completer.submit(b)
        rig.events.returned(b)
        with pytest.raises(DatabaseError):
            completer.ahead_of(failing)
        assert completer.flushed.wait(timeout=10).completed == {b.job_id}
        completer.stop()
    assert [state(db, schema, x.job_id) for x in (a, b)] == [JobState.SUCCEEDED] * 2


# -- the lease renewer ----------------------------------------------------------------


def lease_left(db: psycopg.Connection[Any], schema: str, job_id: int) -> float:
    row = db.execute(
        f"SELECT extract(epoch FROM lease_until - now())::float8 FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return float(row[0])


def test_renewer_extends_held_leases_and_cancels_lost_ones(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    kept, lost = rig.claim(app, 2)  # claimed with a 30 s lease
    renewer = LeaseRenewer(
        rig.store, OWNER, rig.holdings, rig.events, None, rig.closing, RenewerConfig(lease=300)
    )
    assert renewer.run_once() == Renewed(kept=2, lost=0)
    assert lease_left(db, schema, kept.job_id) > 250
    steal(db, schema, lost.job_id)
    assert renewer.run_once() == Renewed(kept=1, lost=1)
    assert lost.cancelled and not kept.cancelled
    # The handler is told to stop; the job stays held until its outcome is refused.
    assert len(rig.holdings) == 2 and rig.ended == []


def test_renewer_leaves_finished_jobs_alone(rig: Rig, app: forklift.App) -> None:
    (ctx,) = rig.claim(app)
    ctx.writing = Writing.WRITTEN  # its outcome is written: not a lease to renew
    renewer = LeaseRenewer(rig.store, OWNER, rig.holdings, rig.events, None, rig.closing)
    assert renewer.run_once() == Renewed(0, 0)


def test_renewer_never_calls_lost_a_lease_its_own_write_ended(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A job's outcome is taken before its write is sent (Holdings): a renewal that
    finds the lease gone, the write's answer not yet recorded, leaves the job alone."""
    (done, gone) = rig.claim(app, 2)
    assert rig.holdings.take([done]) == [done]
    # The completion is sent and commits; its answer is not recorded yet.
    assert rig.store.job_complete_many([(done.job_id, done.attempt, None, None)], OWNER) == {
        done.job_id
    }
    steal(db, schema, gone.job_id)
    renewer = LeaseRenewer(rig.store, OWNER, rig.holdings, rig.events, None, rig.closing)
    assert renewer.run_once() == Renewed(kept=0, lost=1)
    assert not done.cancelled and gone.cancelled


def test_renewer_thread_renews_every_third_of_the_lease(rig: Rig, app: forklift.App) -> None:
    rig.claim(app)
    renewer = LeaseRenewer(
        rig.store, OWNER, rig.holdings, rig.events, None, rig.closing, RenewerConfig(lease=1.5)
    )
    renewer.renewed.enable()
    with rig.running(renewer.run):
        assert renewer.renewed.wait() == Renewed(1, 0)
        assert renewer.renewed.wait() == Renewed(1, 0)


# -- maintenance ----------------------------------------------------------------------


def test_maintenance_rescues_exhausted_leases_and_prunes_old_jobs(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    exhausted = app.enqueue("noop", max_attempts=1)
    old, recent = app.enqueue("noop"), app.enqueue("noop")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'gone:1:x',"
        " seen_running = true, lease_until = now() - interval '1 second' WHERE id = %s",
        (exhausted,),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() - %s::interval"
        " WHERE id = %s",
        ("2 hours", old),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() WHERE id = %s",
        (recent,),
    )
    maintenance = Maintenance(rig.store, app.dsn, TIMEOUTS, MaintenanceConfig(keep_finished=3600))
    assert maintenance.run_once() == Maintained(rescued=1, pruned=1)
    assert state(db, schema, exhausted) == JobState.DEAD
    left = db.execute(f"SELECT id FROM {schema}.jobs ORDER BY id").fetchall()
    assert left == [(exhausted,), (recent,)]
    assert maintenance.run_once() == Maintained(0, 0)


def test_maintenance_skips_while_another_replica_holds_the_section(
    rig: Rig, app: forklift.App, schema: str
) -> None:
    maintenance = Maintenance(rig.store, app.dsn, TIMEOUTS)
    maintenance.ran.enable()
    closing = threading.Event()
    thread = threading.Thread(target=maintenance.run, args=(closing,))
    with singleton(app.dsn, TIMEOUTS, f"maintenance:{schema}") as held:  # another replica
        assert held
        thread.start()  # due at once: the first round runs as the thread starts
        assert maintenance.ran.wait() is None
    closing.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert maintenance.run_once() == Maintained(0, 0)
    assert maintenance.ran.wait() == Maintained(0, 0)


def finish_long_ago(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> None:
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() - interval '2 hours'"
        " WHERE id = ANY(%s)",
        (ids,),
    )


def test_maintenance_behind_on_pruning_comes_back_soon_not_after_its_interval(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    finish_long_ago(db, schema, app.enqueue_many([("noop", {})] * 25))
    config = MaintenanceConfig(interval=3600, keep_finished=60, prune_batch=10, catch_up=0.01)
    maintenance = Maintenance(rig.store, app.dsn, TIMEOUTS, config)
    maintenance.ran.enable()
    closing = threading.Event()
    thread = threading.Thread(target=maintenance.run, args=(closing,))
    thread.start()
    try:
        # Full batches bring the next round on at once; the short one waits an hour.
        rounds = [maintenance.ran.wait(timeout=10) for _ in range(3)]
        assert [r.pruned if r else None for r in rounds] == [10, 10, 5]
        assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone() == (0,)
    finally:
        closing.set()
        thread.join(timeout=5)


def dead_tuples(db: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    """(n_dead_tup, vacuum_count) of the jobs table, as the statistics say now."""
    db.execute("SELECT pg_stat_clear_snapshot()")
    row = db.execute(
        "SELECT n_dead_tup, vacuum_count FROM pg_stat_user_tables"
        " WHERE schemaname = %s AND relname = 'jobs'",
        (schema,),
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def churn(app: forklift.App, db: psycopg.Connection[Any], schema: str, dead: int) -> None:
    """3,000 jobs enqueued and deleted; until the statistics count `dead` dead tuples (the
    deleting session reports them when it goes idle, within a second)."""
    ids = app.enqueue_many([("noop", {})] * 3000)
    db.execute(f"DELETE FROM {schema}.jobs WHERE id = ANY(%s)", (ids,))
    wait_for(lambda: dead_tuples(db, schema)[0] >= dead, what=f"{dead:,} dead tuples counted")


def test_maintenance_vacuums_the_jobs_table_once_its_dead_tuples_pile_up(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    maintenance = Maintenance(rig.store, app.dsn, TIMEOUTS, MaintenanceConfig(interval=0.01))
    assert maintenance.run_once() == Maintained(0, 0, vacuumed=False)  # nothing to reclaim
    churn(app, db, schema, dead=3000)
    wait_for(lambda: maintenance.run_once() == Maintained(0, 0, vacuumed=True), what="a vacuum")
    dead, vacuums = dead_tuples(db, schema)
    assert dead < 3000 and vacuums == 1  # reclaimed (what a concurrent snapshot still sees stays)


def test_maintenance_vacuums_once_while_another_transaction_holds_the_horizon(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str, dsn: str
) -> None:
    db.execute(f"ALTER TABLE {schema}.jobs SET (autovacuum_enabled = false)")  # ours alone
    maintenance = Maintenance(rig.store, app.dsn, TIMEOUTS, MaintenanceConfig(interval=0))
    with horizon_held(dsn):
        churn(app, db, schema, dead=3000)
        assert maintenance.run_once() == Maintained(0, 0, vacuumed=True)
        # That VACUUM could remove none of them: they are still counted, and due.
        churn(app, db, schema, dead=6000)
        # While the horizon stands, a VACUUM would find nothing the last one left.
        assert [maintenance.run_once() for _ in range(5)] == [Maintained(0, 0)] * 5
        assert dead_tuples(db, schema)[1] == 1
    wait_for(lambda: maintenance.run_once() == Maintained(0, 0, vacuumed=True), what="a vacuum")
    dead, vacuums = dead_tuples(db, schema)
    assert dead < 3000 and vacuums == 2


# -- the listener ---------------------------------------------------------------------


def listener_for(rig: Rig, app: forklift.App, queues: tuple[str, ...]) -> Listener:
    return Listener(
        rig.store, app.dsn, TIMEOUTS, queues, rig.wakeup, rig.closing, ListenerConfig(tick=0.1)
    )


def listening_backend(db: psycopg.Connection[Any], schema: str) -> tuple[Any, ...] | None:
    """The pid of this schema's LISTEN connection, by what pg_stat_activity shows of it
    (the statement text bench/throughput.py waits on too)."""
    return db.execute(
        "SELECT pid FROM pg_stat_activity"
        " WHERE application_name = 'forklift-listener' AND query = %s",
        (f'LISTEN "{schema}_jobs"',),
    ).fetchone()


def test_listener_wakes_for_its_queues_only(rig: Rig, app: forklift.App) -> None:
    listener = listener_for(rig, app, ("mine",))
    listener.woken.enable()
    with rig.store.channel_listen(app.dsn, TIMEOUTS) as notes:
        app.enqueue("noop", queue="other")
        app.enqueue("noop", queue="mine")
        # Notifications arrive in commit order: by the time "mine" wakes it, "other"
        # has been heard, and ignored.
        assert wait_for(lambda: listener.run_once(notes), what="a wake-up") == 1
    assert listener.woken.wait() == "mine"
    assert rig.wakeup.wait(0)


def test_listener_thread_listens_and_reconnects(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    listener = listener_for(rig, app, ("default",))
    listener.listening.enable()
    with rig.running(listener.run):
        listener.listening.wait()
        rig.wakeup.clear()
        (pid,) = wait_for(lambda: listening_backend(db, schema), what="LISTEN seen")
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        listener.listening.wait()  # back after its reconnect backoff
        assert rig.wakeup.wait(0)  # and looked for what it may have missed


def test_a_broken_listen_connection_raises_a_database_error(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    listen = rig.store.channel_listen(app.dsn, TIMEOUTS)
    with pytest.raises(DatabaseError) as caught, listen as notes:
        (pid,) = wait_for(lambda: listening_backend(db, schema), what="LISTEN seen")
        db.execute("SELECT pg_terminate_backend(%s)", (pid,))
        for _ in range(50):
            list(notes.wait(0.1))
    assert isinstance(caught.value.__cause__, psycopg.Error)
