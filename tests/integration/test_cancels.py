"""A worker hearing operators' cancels, against a real PostgreSQL: on the control channel,
and through the lease renewer when the notification was missed."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.admin import JobAdmin
from forklift.store import ClaimedJob
from forklift.testing import wait_for
from forklift.workers.cancels import Cancels, parse_order
from forklift.workers.completer import Completer
from forklift.workers.context import Stage
from forklift.workers.events import Outcome
from forklift.workers.listener import Listener, ListenerConfig
from forklift.workers.renewer import LeaseRenewer, RenewerConfig
from tests.integration.test_worker_services import OWNER, TIMEOUTS, Rig, open_rig


@pytest.fixture
def rig(dsn: str, schema: str, app: forklift.App) -> Iterator[Rig]:
    with open_rig(dsn, schema, "test-cancels") as r:
        yield r


def test_only_well_formed_orders_are_taken() -> None:
    assert parse_order("cancel 12 3") == (12, 3)
    for bad in ("cancel 12", "cancel a 3", "cancel 1 2 3", "stop 1 2", "", "cancel -1 2"):
        assert parse_order(bad) is None, bad


def test_the_control_channel_cancels_the_job_held_and_tells_the_supervisor(
    rig: Rig, app: forklift.App, dsn: str, schema: str
) -> None:
    told: list[ClaimedJob] = []
    cancels = Cancels(rig.store, rig.holdings, rig.events, told.append)
    [running, other] = rig.claim(app, 2)
    running.stage = Stage.RUNNING  # its handler runs
    listener = Listener(
        rig.store, app.dsn, TIMEOUTS, ("default",), rig.wakeup, rig.closing,
        ListenerConfig(tick=0.1), on_control=cancels.notice,
    )  # fmt: skip
    with rig.store.channel_listen(app.dsn, TIMEOUTS) as notes:
        JobAdmin(dsn, schema).job_cancel_many([running.job_id])
        wait_for(lambda: listener.run_once(notes) == 0 and running.cancelled, what="heard")
    assert running.cancel_requested and not other.cancelled
    assert [j.id for j in told] == [running.job_id]
    assert cancels.heard(running) is False  # once


def test_a_missed_notification_is_found_at_the_next_renewal(
    rig: Rig, app: forklift.App, dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    cancels = Cancels(rig.store, rig.holdings, rig.events)
    renewer = LeaseRenewer(
        rig.store, OWNER, rig.holdings, rig.events, None, rig.closing,
        RenewerConfig(30.0), cancels,
    )  # fmt: skip
    [job, kept] = rig.claim(app, 2)
    JobAdmin(dsn, schema).job_cancel_many([job.job_id])
    renewed = renewer.run_once()
    assert (renewed.kept, renewed.lost) == (1, 1)
    assert job.cancelled and job.cancel_requested and not kept.cancelled
    # Its handler returns: the completion is refused, and the job ends as a cancel.
    rig.events.returned(job)
    Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing).flush([job])
    assert rig.ended == [(job.job_id, Outcome.CANCELLED)]
    row = db.execute(f"SELECT state FROM {schema}.jobs WHERE id = %s", (job.job_id,)).fetchone()
    assert row == ("cancelled",)


def test_a_forged_notification_cancels_nothing(
    rig: Rig, app: forklift.App, dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """NOTIFY needs no privilege: a role with no rights on forklift's schema can send a
    well-formed `cancel <id> <attempt>`. The worker checks the database first."""
    told: list[ClaimedJob] = []
    cancels = Cancels(rig.store, rig.holdings, rig.events, told.append)
    [running] = rig.claim(app, 1)
    running.stage = Stage.RUNNING  # its handler runs
    role = f"{schema}_outsider"
    db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        listener = Listener(
            rig.store, app.dsn, TIMEOUTS, ("default",), rig.wakeup, rig.closing,
            ListenerConfig(tick=0.1), on_control=cancels.notice,
        )  # fmt: skip
        heard: list[str] = []

        def on_control(payload: str) -> bool:
            heard.append(payload)
            return cancels.notice(payload)

        listener.on_control = on_control
        outsider = psycopg.conninfo.make_conninfo(dsn, user=role)
        with rig.store.channel_listen(app.dsn, TIMEOUTS) as notes:
            with psycopg.connect(outsider, autocommit=True) as attacker:
                channel = f"{schema}_ctl"
                attacker.execute(
                    f"NOTIFY \"{channel}\", 'cancel {running.job_id} {running.attempt}'"
                )
            wait_for(lambda: listener.run_once(notes) == 0 and bool(heard), what="the forgery")
        assert heard == [f"cancel {running.job_id} {running.attempt}"]
        assert not running.cancelled and not running.cancel_requested and told == []
        row = db.execute(f"SELECT state FROM {schema}.jobs WHERE id = %s", (running.job_id,))
        assert row.fetchone() == ("running",)
        # The real cancel, on the same path, is still heard.
        with rig.store.channel_listen(app.dsn, TIMEOUTS) as notes:
            JobAdmin(dsn, schema).job_cancel_many([running.job_id])
            wait_for(lambda: listener.run_once(notes) == 0 and running.cancelled, what="heard")
        assert [j.id for j in told] == [running.job_id]
    finally:
        db.execute(f'DROP ROLE "{role}"')
