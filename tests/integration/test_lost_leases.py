"""A worker lost with its host (cut off past its lease, or gone) held more jobs than it
ran: jobs claimed ahead wait for a slot. A lost lease charges an attempt only to a job
whose handler its worker's lease renewals saw running; the others are forgiven, given
that attempt back as one more, at most 3 times a job. The same for every path that takes
a lost worker's jobs: a peer's claim, the rescue of jobs out of attempts, and a peer
supervisor that finds the host's liveness lock free."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.admin.jobs import JobAdmin
from forklift.shown import jobview
from forklift.supervisor.store import SupervisorStore

Db = psycopg.Connection[Any]

LOST = "host-a:4100:aa11aa@4099.ab12ab"  # nobody holds its supervisor's lock: gone
PEER = "host-b:4200:bb22bb@4199.bc23bc"
UNCHARGED = "before its handler was seen running: not charged"


@pytest.fixture
def app(dsn: str, schema: str) -> Iterator[forklift.App]:
    a = forklift.App(dsn, schema=schema)

    @a.task
    def plain(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    yield a
    a.close()


def lapse(db: Db, schema: str, owner: str) -> None:
    """Every lease `owner` holds ran out a second ago (its host was cut off)."""
    db.execute(
        f"UPDATE {schema}.jobs SET lease_until = now() - interval '1 second'"
        " WHERE lease_owner = %s",
        (owner,),
    )


def job(db: Db, schema: str, job_id: int) -> tuple[Any, ...]:
    """(state, attempts, max_attempts, leases_forgiven, crashes, last_error)."""
    row = db.execute(
        f"SELECT state::text, attempts, max_attempts, leases_forgiven, crashes, last_error"
        f" FROM {schema}.jobs WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return tuple(row)


def test_a_peer_takes_a_lost_workers_jobs_charging_only_the_one_whose_handler_ran(
    app: forklift.App, dsn: str, db: Db, schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    ran, ahead = app.enqueue_many([("plain", {"n": i}) for i in range(2)])
    claimed = app.store.job_claim(["default"], LOST, 2, 30.0, expired=False)
    assert [j.id for j in claimed] == [ran, ahead]
    # Its worker renewed both leases; the first job's handler had been called.
    assert app.store.lease_renew_many([(ran, 1), (ahead, 1)], LOST, 30.0, seen=[ran]) == {
        ran,
        ahead,
    }
    lapse(db, schema, LOST)

    taken = app.store.job_claim(["default"], PEER, 2, 30.0, expired=True)

    assert {(j.id, j.attempt, j.max_attempts) for j in taken} == {(ran, 2, 5), (ahead, 2, 6)}
    assert job(db, schema, ran) == ("running", 2, 5, 0, 0, f"LeaseExpired: lease of {LOST} expired")
    state, attempts, most, forgiven, crashes, error = job(db, schema, ahead)
    assert (state, attempts, most, forgiven, crashes) == ("running", 2, 6, 1, 0)
    assert error.startswith(f"LeaseExpired: lease of {LOST} expired {UNCHARGED}"), error
    # What an operator reads of it: why max_attempts is one more than it was enqueued with.
    detail = JobAdmin(dsn, schema).job_get(ahead)
    assert detail.leases_forgiven == 1 and jobview.detail_json(detail)["leases_forgiven"] == 1
    jobview.print_detail(detail)
    shown = capsys.readouterr().out
    assert "attempts     2 of 6 (1 added: a lease lost before its handler ran)" in shown, shown


def test_a_job_out_of_attempts_whose_last_one_never_started_is_claimed_not_dead_lettered(
    app: forklift.App, db: Db, schema: str
) -> None:
    unseen, seen = app.enqueue_many([("plain", {"n": i}) for i in range(2)])
    db.execute(f"UPDATE {schema}.jobs SET max_attempts = 1")
    app.store.job_claim(["default"], LOST, 2, 30.0, expired=False)
    app.store.lease_renew_many([(unseen, 1), (seen, 1)], LOST, 30.0, seen=[seen])
    lapse(db, schema, LOST)

    assert app.store.job_rescue_exhausted() == [seen]
    taken = app.store.job_claim(["default"], PEER, 2, 30.0, expired=True)

    assert [(j.id, j.attempt, j.max_attempts) for j in taken] == [(unseen, 2, 2)]
    assert job(db, schema, seen)[:2] == ("dead", 1)


def test_a_job_is_forgiven_three_lost_leases_then_charged(
    app: forklift.App, dsn: str, db: Db, schema: str
) -> None:
    (job_id,) = app.enqueue_many([("plain", {})])
    owners = [f"host-{n}:{n}:ff{n}" for n in range(5)]
    app.store.job_claim(["default"], owners[0], 1, 30.0, expired=False)
    for before, after in itertools.pairwise(owners):
        lapse(db, schema, before)  # its host took itself down before any renewal
        (taken,) = app.store.job_claim(["default"], after, 1, 30.0, expired=True)
        assert taken.id == job_id
    # Four lost leases: attempts 1-3 forgiven, the fourth charged.
    state, attempts, most, forgiven, _, error = job(db, schema, job_id)
    assert (state, attempts, most, forgiven) == ("running", 5, 8, 3)
    assert error == f"LeaseExpired: lease of {owners[3]} expired"
    # An operator's retry gives it a fresh budget: the one it was enqueued with.
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', lease_owner = NULL WHERE id = %s", (job_id,)
    )
    (acted,) = JobAdmin(dsn, schema).job_retry_many([job_id], by="op")
    assert acted.done
    assert job(db, schema, job_id)[:4] == ("ready", 0, 5, 0)


def test_a_peer_supervisor_charges_a_vanished_hosts_crash_only_to_jobs_seen_running(
    app: forklift.App, dsn: str, db: Db, schema: str
) -> None:
    ran, ahead = app.enqueue_many([("plain", {"n": i}) for i in range(2)])
    app.store.job_claim(["default"], LOST, 2, 30.0, expired=False)
    app.store.lease_renew_many([(ran, 1), (ahead, 1)], LOST, 30.0, seen=[ran])
    store = SupervisorStore(dsn, schema, _db.Timeouts())
    lost = f"WorkerLost: worker {LOST} lost its database session"

    charged = store.job_fail_orphaned(LOST, lost, retry=None, unlocked=True, forgive=True)

    assert {(c.id, c.state, c.forgiven) for c in charged} == {
        (ran, "ready", False),
        (ahead, "ready", True),
    }
    assert job(db, schema, ran) == ("ready", 1, 5, 0, 1, lost)
    state, attempts, most, forgiven, crashes, error = job(db, schema, ahead)
    assert (state, attempts, most, forgiven, crashes) == ("ready", 1, 6, 1, 0)
    assert error.startswith(f"{lost} {UNCHARGED}"), error
