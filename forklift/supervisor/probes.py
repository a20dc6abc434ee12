"""What /healthz, /readyz and the live gauges of /metrics answer.

All of it is read from the loop's published snapshot and, cached for a second or two,
from the database; nothing here touches the loop's live state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from forklift._events import emit
from forklift.admin import AdminStore, QueueStats
from forklift.errors import DatabaseError, SchemaMissing
from forklift.metrics import Totals, TotalsCollector
from forklift.supervisor.snapshot import SnapshotBoard

log = logging.getLogger(__name__)

GAUGE_TTL = 2.0  # queue gauges are read from the database at most this often
READY_TTL = 1.0  # and the readiness ping
STALLED_AFTER = 10.0  # a loop silent this long fails /healthz

T = TypeVar("T")


@dataclass(frozen=True)
class _Cached(Generic[T]):
    value: T | None = None  # None: the read failed (or none was made yet)
    at: float = float("-inf")


class Probes:
    """Health and readiness answers, and the database reads behind them (HTTP thread)."""

    def __init__(self, board: SnapshotBoard, admin: AdminStore, queues: Sequence[str] = ()) -> None:
        self.board = board
        self.admin = admin
        self.queues = tuple(queues)  # served here: their gauges read 0 when empty
        self._stats: _Cached[list[QueueStats]] = _Cached()
        self._db_ready: _Cached[bool] = _Cached()
        self._db_problem = "database unreachable"

    def health(self) -> tuple[int, str]:
        silent = time.monotonic() - self.board.read().last_tick
        if silent > STALLED_AFTER:
            return 503, f"supervisor loop stalled for {silent:.0f} s\n"
        return 200, "ok\n"

    def readiness(self) -> tuple[int, str]:
        snapshot = self.board.read()
        reasons = []
        if snapshot.stopping:
            reasons.append("shutting down")
        if snapshot.crash_loop:
            reasons.append("workers are crash-looping")
        if snapshot.live_workers == 0 and not snapshot.stopping:  # stopping: they finish
            reasons.append("no worker process alive")
        if not self.database_ready():
            reasons.append(self._db_problem)
        if reasons:
            return 503, "not ready: " + "; ".join(reasons) + "\n"
        return 200, "ready\n"

    def queue_stats(self) -> list[QueueStats] | None:
        """Per-queue counts, at most GAUGE_TTL old; None while the database is away."""
        now = time.monotonic()
        if now - self._stats.at > GAUGE_TTL:
            try:
                stats = self.admin.queue_stats(throughput=False, include=self.queues)
                self._stats = _Cached(stats, now)
            except DatabaseError as exc:
                emit(log, "metrics.queue_stats_failed", logging.WARNING, error=exc)
                self._stats = _Cached(None, now)
        return self._stats.value

    def database_ready(self) -> bool:
        """Whether the database answered a ping at most READY_TTL ago; logs changes only."""
        now = time.monotonic()
        if now - self._db_ready.at <= READY_TTL:
            return bool(self._db_ready.value)
        before = self._db_ready.value
        try:
            self.admin.ping()
        except DatabaseError as exc:
            missing = isinstance(exc, SchemaMissing)
            problem = str(exc) if missing else "database unreachable"
            if before is not False or problem != self._db_problem:
                event = (
                    "supervisor.schema_missing" if missing else "supervisor.database_unreachable"
                )
                emit(log, event, logging.WARNING, error=exc)
            self._db_problem = problem
            self._db_ready = _Cached(False, now)
        else:
            if before is False:
                emit(log, "supervisor.database_reachable")
            self._db_ready = _Cached(True, now)
        return bool(self._db_ready.value)


def metrics_registry(totals: Totals, probes: Probes, *more: Collector) -> CollectorRegistry:
    """What /metrics serves: the children's summed counters, the live gauges, and `more`
    (the scheduler's)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TotalsCollector(totals))
    registry.register(LiveCollector(probes))
    for collector in more:
        registry.register(collector)
    return registry


class LiveCollector(Collector):
    """Gauges read at scrape time: queue depth from the database, workers from the snapshot."""

    def __init__(self, probes: Probes) -> None:
        self.probes = probes

    def collect(self) -> Iterator[Metric]:
        yield from self._queue_gauges(self.probes.queue_stats() or [])
        snapshot = self.probes.board.read()
        workers = GaugeMetricFamily(
            "forklift_workers", "Worker processes by state.", labels=["state"]
        )
        workers.add_metric(["busy"], snapshot.busy)
        workers.add_metric(["idle"], snapshot.idle)
        yield workers
        yield GaugeMetricFamily(
            "forklift_up", "1 while the supervisor is ready.", value=1 if snapshot.ready else 0
        )

    @staticmethod
    def _queue_gauges(stats: list[QueueStats]) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "forklift_queue_depth", "Jobs per queue and state.", labels=["queue", "state"]
        )
        oldest = GaugeMetricFamily(
            "forklift_oldest_ready_age_seconds", "Age of the oldest due job.", labels=["queue"]
        )
        paused = GaugeMetricFamily(
            "forklift_queue_paused", "1 while the queue is paused (no claims).", labels=["queue"]
        )
        for s in stats:
            for state, n in (
                ("ready", s.ready),
                ("scheduled", s.scheduled),
                ("running", s.running),
                ("dead", s.dead),
            ):
                depth.add_metric([s.queue, state], n)
            oldest.add_metric([s.queue], s.oldest_ready_age or 0.0)
            paused.add_metric([s.queue], 1 if s.paused else 0)
        yield depth
        yield oldest
        yield paused
