"""/healthz, /readyz and the live gauges, from a snapshot and a fake database."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from forklift.admin import QueueStats
from forklift.metrics import Totals
from forklift.supervisor.probes import LiveCollector, Probes, metrics_registry
from forklift.supervisor.snapshot import Snapshot, SnapshotBoard
from tests.unit.supervisor.conftest import FakeAdmin

READY = Snapshot(last_tick=0.0, supervisor_id="s", live_workers=2, busy=1, idle=1)


def probes_for(snapshot: Snapshot, admin: FakeAdmin | None = None) -> Probes:
    fresh = replace(snapshot, last_tick=time.monotonic())
    return Probes(SnapshotBoard(fresh), admin or FakeAdmin())


def test_ready() -> None:
    assert probes_for(READY).readiness() == (200, "ready\n")


@pytest.mark.parametrize(
    ("changes", "reason"),
    [
        ({"stopping": True}, "shutting down"),
        ({"crash_loop": True}, "workers are crash-looping"),
        ({"live_workers": 0}, "no worker process alive"),
        # A graceful stop retires every worker while they finish: not "none alive".
        ({"stopping": True, "live_workers": 0}, "shutting down"),
    ],
)
def test_not_ready_says_why(changes: dict[str, Any], reason: str) -> None:
    status, body = probes_for(replace(READY, **changes)).readiness()
    assert status == 503 and body == f"not ready: {reason}\n"


def test_not_ready_without_the_database_and_the_ping_is_cached() -> None:
    admin = FakeAdmin()
    probes = probes_for(READY, admin)
    admin.down = True
    assert probes.readiness() == (503, "not ready: database unreachable\n")
    admin.down = False
    assert probes.readiness()[0] == 503  # within READY_TTL: the cached answer
    assert admin.pings == 1


def test_health_fails_once_the_loop_stalls() -> None:
    assert probes_for(READY).health() == (200, "ok\n")
    stalled = Probes(SnapshotBoard(Snapshot(last_tick=time.monotonic() - 11)), FakeAdmin())
    status, body = stalled.health()
    assert status == 503 and body.startswith("supervisor loop stalled for 11 s")


def test_the_live_gauges() -> None:
    admin = FakeAdmin()
    admin.stats = [QueueStats("default", 3, 1, 2, 4, 5.5, 0)]
    families = {f.name: f for f in LiveCollector(probes_for(READY, admin)).collect()}
    depth = {s.labels["state"]: s.value for s in families["forklift_queue_depth"].samples}
    assert depth == {"ready": 3, "scheduled": 1, "running": 2, "dead": 4}
    assert families["forklift_oldest_ready_age_seconds"].samples[0].value == 5.5
    workers = {s.labels["state"]: s.value for s in families["forklift_workers"].samples}
    assert workers == {"busy": 1, "idle": 1}
    assert families["forklift_up"].samples[0].value == 1


def test_without_the_database_the_queue_gauges_are_empty_and_the_rest_still_there() -> None:
    admin = FakeAdmin()
    admin.down = True
    registry = metrics_registry(Totals(), probes_for(READY, admin))
    assert registry.get_sample_value("forklift_up") == 1
    assert registry.get_sample_value("forklift_workers", {"state": "busy"}) == 1
    assert registry.get_sample_value("forklift_queue_depth", {"queue": "default"}) is None
