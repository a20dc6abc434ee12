"""/healthz, /readyz and the live gauges, from a snapshot and a fake database."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import pytest

from forklift.admin import QueueStats
from forklift.metrics import Totals
from forklift.supervisor.probes import STALE_AFTER, LiveCollector, Probes, metrics_registry
from forklift.supervisor.snapshot import Snapshot, SnapshotBoard
from tests.unit.supervisor.conftest import FakeAdmin

READY = Snapshot(last_tick=0.0, supervisor_id="s", live_workers=2, busy=1, idle=1)


def probes_for(snapshot: Snapshot, admin: FakeAdmin | None = None) -> Probes:
    """Probes serving "default", their database answers read once (as the database thread does)."""
    fresh = replace(snapshot, last_tick=time.monotonic())
    probes = Probes(SnapshotBoard(fresh), admin or FakeAdmin(), ["default"])
    probes.refresh()
    probes.refresh_stats()
    return probes


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


def test_not_ready_without_the_database_and_no_probe_asks_it() -> None:
    admin = FakeAdmin()
    probes = probes_for(READY, admin)
    assert admin.pings == 1
    admin.down = True
    for _ in range(3):  # the answers come from memory: no request waits on the database
        assert probes.readiness() == (200, "ready\n")
        assert probes.health() == (200, "ok\n")
    assert admin.pings == 1
    probes.refresh()
    assert probes.readiness() == (503, "not ready: database unreachable\n")
    assert probes.queue_stats() is None
    admin.down = False
    probes.refresh()
    assert probes.readiness() == (200, "ready\n")


def test_not_ready_before_the_first_check_and_once_the_checks_go_stale() -> None:
    probes = Probes(SnapshotBoard(replace(READY, last_tick=time.monotonic())), FakeAdmin())
    assert probes.readiness() == (503, "not ready: database has not answered yet\n")
    probes.refresh()
    assert probes.readiness()[0] == 200
    probes._db_ready = replace(probes._db_ready, at=time.monotonic() - STALE_AFTER - 1)
    status, body = probes.readiness()
    assert status == 503 and body.startswith("not ready: database not checked for 11 s")


def test_gauges_only_for_the_served_queues() -> None:
    admin = FakeAdmin()
    admin.stats = [QueueStats(f"q{i}", 1, 0, 0, 0, 1.0, 0) for i in range(3000)]
    admin.stats.append(QueueStats("default", 3, 1, 2, 4, 5.5, 0))
    registry = metrics_registry(Totals(), probes_for(READY, admin))
    queues = {
        s.labels["queue"]
        for family in registry.collect()
        for s in family.samples
        if "queue" in s.labels
    }
    assert queues == {"default"}


def test_health_fails_once_the_loop_stalls() -> None:
    assert probes_for(READY).health() == (200, "ok\n")
    stalled = Probes(SnapshotBoard(Snapshot(last_tick=time.monotonic() - 11)), FakeAdmin())
    status, body = stalled.health()
    assert status == 503 and body.startswith("supervisor loop stalled for 11 s")


def test_the_live_gauges() -> None:
    admin = FakeAdmin()
    admin.stats = [QueueStats("default", 3, 1, 2, 4, 5.5, 0, blocked=6)]
    families = {f.name: f for f in LiveCollector(probes_for(READY, admin)).collect()}
    depth = {s.labels["state"]: s.value for s in families["forklift_queue_depth"].samples}
    assert depth == {"ready": 3, "scheduled": 1, "running": 2, "dead": 4, "blocked": 6}
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


def test_the_limit_gauges_and_the_rejected_counter() -> None:
    admin = FakeAdmin()
    admin.stats = [
        QueueStats("default", 0, 0, 0, 0, None, concurrency=4, rate=100, per=60.0, rejected=7),
        QueueStats("other", 0, 0, 0, 0, None, max_depth=5),  # not served here
    ]
    registry = metrics_registry(Totals(), probes_for(READY, admin))
    limits = {
        s.labels["kind"]: s.value
        for f in registry.collect()
        if f.name == "forklift_queue_limit"
        for s in f.samples
        if s.labels["queue"] == "default"
    }
    assert limits == {"concurrency": 4, "rate_per_second": 100 / 60}  # no max_depth: no series
    assert registry.get_sample_value("forklift_enqueue_rejected_total", {"queue": "default"}) == 7
    assert (
        registry.get_sample_value("forklift_queue_limit", {"queue": "other", "kind": "max_depth"})
        is None
    )
