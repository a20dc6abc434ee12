"""The process registry heartbeat against a real PostgreSQL, called and on its thread."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db
from forklift.admin import AdminStore
from forklift.metrics import Totals
from forklift.supervisor.ops import OpsServer
from forklift.supervisor.probes import Probes, metrics_registry
from forklift.supervisor.registry import HeartbeatResult, ProcessRegistry, RegistryConfig
from forklift.supervisor.snapshot import Snapshot, SnapshotBoard
from forklift.supervisor.store import ProcessInfo, SupervisorStore
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


def test_pruning_charges_a_silent_workers_jobs_with_their_attempts(
    dsn: str, db: psycopg.Connection[Any], schema: str, store: SupervisorStore
) -> None:
    store.process_upsert_many(snapshot("here:2:w").registry_rows)
    job_id = running_job(dsn, db, schema, "here:2:w")
    db.execute(f"UPDATE {schema}.processes SET heartbeat_at = now() - interval '1 minute'")
    pruned, charged = store.process_prune_stale(20.0)
    assert sorted(pruned) == [SUP, "here:2:w"]
    assert [(j.id, j.state, j.attempts) for j in charged] == [(job_id, "ready", 1)]


def test_run_once_writes_forgets_and_prunes(
    dsn: str, db: psycopg.Connection[Any], schema: str, store: SupervisorStore
) -> None:
    board = SnapshotBoard(snapshot("here:2:w", "here:3:w"))
    totals = Totals()
    registry = ProcessRegistry(store, board, totals)
    assert registry.run_once() == HeartbeatResult(3, 0, 0)
    assert registered(db, schema) == [SUP, "here:2:w", "here:3:w"]
    # A worker gone from the snapshot is forgotten; a silent host's rows are pruned
    # and the job its worker held is charged.
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, supervisor_id, heartbeat_at)"
        " VALUES ('gone:1:a', 'supervisor', 'gone', 1, NULL, now() - interval '1 minute'),"
        " ('gone:2:b', 'worker', 'gone', 2, 'gone:1:a', now() - interval '1 minute')"
    )
    running_job(dsn, db, schema, "gone:2:b")
    board.publish(snapshot("here:2:w"))
    assert registry.run_once() == HeartbeatResult(2, 2, 1)
    assert registered(db, schema) == [SUP, "here:2:w"]
    assert totals.jobs == {("default", "noop", "crashed"): 1}
    registry.deregister()
    assert registered(db, schema) == []


def test_the_ops_thread_heartbeats_at_once_and_then_every_interval(
    dsn: str, db: psycopg.Connection[Any], schema: str, store: SupervisorStore
) -> None:
    board = SnapshotBoard(snapshot("here:2:w"))
    registry = ProcessRegistry(store, board, Totals(), RegistryConfig(every=0.05))
    registry.beat.enable()
    probes = Probes(board, AdminStore(dsn, schema))
    ops = OpsServer(None, probes, metrics_registry(Totals(), probes), registry)
    ops.start()
    try:
        assert registry.beat.wait() == HeartbeatResult(2, 0, 0)
        board.publish(snapshot("here:2:w", "here:3:w"))
        while registry.beat.wait().rows_written != 3:
            pass  # a heartbeat that ran before the publish
        assert registered(db, schema) == [SUP, "here:2:w", "here:3:w"]
    finally:
        ops.stop()  # deregisters too
    assert registered(db, schema) == []
