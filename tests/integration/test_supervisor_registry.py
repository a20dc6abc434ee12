"""The process registry heartbeat against a real PostgreSQL, called and on its thread."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db, _locks
from forklift._ids import child_owner
from forklift.admin import AdminStore
from forklift.metrics import Totals
from forklift.supervisor.dbthread import DbService, DbThread
from forklift.supervisor.deaths import VanishedConfig, VanishedOwners, VanishedResult
from forklift.supervisor.http import routes_for
from forklift.supervisor.ops import OpsServer
from forklift.supervisor.probes import Probes, metrics_registry
from forklift.supervisor.registry import HeartbeatResult, ProcessRegistry, RegistryConfig
from forklift.supervisor.session import HintFanout, SupervisorSession
from forklift.supervisor.snapshot import Snapshot, SnapshotBoard
from forklift.supervisor.store import ProcessInfo, SupervisorStore
from tests.integration.conftest import let_go
from tests.integration.test_supervisor_store import leased

SUP = "here:1:s"


def row(process_id: str, kind: str = "worker") -> ProcessInfo:
    sup = None if kind == "supervisor" else SUP
    return ProcessInfo(process_id, kind, "here", 1, sup, "default", None, 1024, 1.0)


def snapshot(*workers: str) -> Snapshot:
    rows = (row(SUP, "supervisor"), *(row(w) for w in workers))
    return Snapshot(last_tick=0.0, supervisor_id=SUP, registry_rows=rows)


def registered(db: psycopg.Connection[Any], schema: str) -> list[str]:
    return [r[0] for r in db.execute(f"SELECT id FROM {schema}.processes ORDER BY id")]


@pytest.fixture
def store(dsn: str, schema: str) -> SupervisorStore:
    return SupervisorStore(dsn, schema, _db.Timeouts())


def running_job(dsn: str, db: psycopg.Connection[Any], schema: str, owner: str) -> int:
    app = forklift.App(dsn, schema=schema)
    try:
        return leased(db, schema, app, attempts=1, owner=owner)
    finally:
        app.close()


def test_a_late_heartbeat_charges_no_job_of_a_supervisor_whose_lock_is_held(
    dsn: str, db: psycopg.Connection[Any], schema: str, store: SupervisorStore
) -> None:
    """Its heartbeats stalled (it could not open new connections) while it and its
    workers lived: neither the registry nor a peer's check charges its child's job."""
    child = child_owner(SUP, 2, "w")
    store.process_upsert_many(snapshot(child).registry_rows)
    job_id = running_job(dsn, db, schema, child)
    db.execute(f"UPDATE {schema}.processes SET heartbeat_at = now() - interval '1 minute'")
    session = psycopg.connect(dsn, autocommit=True)
    assert _locks.try_take(session, _locks.liveness(schema, SUP))
    assert sorted(store.process_prune_stale(20.0)) == [SUP, child]
    peer = VanishedOwners(store, Totals(), VanishedConfig(confirm=1.0), me=lambda: "peer")
    assert peer.run_once(now=1.0) == VanishedResult(unlocked=0, charged=0)
    assert peer.run_once(now=2.0) == VanishedResult(unlocked=0, charged=0)
    let_go(session, db, _locks.liveness(schema, SUP))
    state = db.execute(f"SELECT state, attempts FROM {schema}.jobs WHERE id = %s", (job_id,))
    assert state.fetchone() == ("running", 1)
    # Its own supervisor never charges it as a peer would (its reaper does), even with
    # the lock free; a peer does, once the lock is free in two rounds a second apart.
    own = VanishedOwners(store, Totals(), VanishedConfig(confirm=0.0), me=lambda: SUP)
    assert own.run_once(now=3.0) == VanishedResult(unlocked=0, charged=0)
    assert peer.run_once(now=3.0) == VanishedResult(unlocked=1, charged=0)
    assert peer.run_once(now=4.0).charged == 1


def test_run_once_writes_forgets_and_prunes(
    dsn: str, db: psycopg.Connection[Any], schema: str, store: SupervisorStore
) -> None:
    board = SnapshotBoard(snapshot("here:2:w", "here:3:w"))
    registry = ProcessRegistry(store, board)
    assert registry.run_once() == HeartbeatResult(3, 0)
    assert registered(db, schema) == [SUP, "here:2:w", "here:3:w"]
    # A worker gone from the snapshot is forgotten; a silent host's rows are pruned,
    # and the job its worker held is left to the liveness check (deaths.py).
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, supervisor_id, heartbeat_at)"
        " VALUES ('gone:1:a', 'supervisor', 'gone', 1, NULL, now() - interval '1 minute'),"
        " ('gone:2:b', 'worker', 'gone', 2, 'gone:1:a', now() - interval '1 minute')"
    )
    running_job(dsn, db, schema, "gone:2:b")
    board.publish(snapshot("here:2:w"))
    assert registry.run_once() == HeartbeatResult(2, 2)
    assert registered(db, schema) == [SUP, "here:2:w"]
    registry.deregister()
    assert registered(db, schema) == []


def test_the_ops_thread_heartbeats_at_once_and_then_every_interval(
    dsn: str, db: psycopg.Connection[Any], schema: str, store: SupervisorStore
) -> None:
    board = SnapshotBoard(snapshot("here:2:w"))
    registry = ProcessRegistry(store, board, RegistryConfig(every=0.05))
    registry.beat.enable()
    probes = Probes(board, AdminStore(dsn, schema))
    db_thread = DbThread([DbService("registry", 0.05, registry.run_once)])
    session = SupervisorSession(dsn, _db.Timeouts(), schema, ("default",), HintFanout())
    session.supervisor_id = SUP
    ops = OpsServer(None, registry, db_thread, session)
    ops.start(routes_for(probes, metrics_registry(Totals(), probes)))
    try:
        assert registry.beat.wait() == HeartbeatResult(2, 0)
        board.publish(snapshot("here:2:w", "here:3:w"))
        while registry.beat.wait().rows_written != 3:
            pass  # a heartbeat that ran before the publish
        assert registered(db, schema) == [SUP, "here:2:w", "here:3:w"]
    finally:
        ops.stop()  # deregisters too
    assert registered(db, schema) == []
