"""What /healthz, /readyz and the live gauges of /metrics answer.

Each answer is read from memory: the loop's published snapshot, and the database's last
answers, which `refresh()` gathers on the database thread (never on the request path). Nothing
here touches the loop's live state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from forklift._events import emit
from forklift._service import Repeats
from forklift.admin import AdminStore, QueueStats
from forklift.errors import DatabaseError, SchemaMissing
from forklift.metrics import Totals
from forklift.supervisor.exposition import TotalsCollector
from forklift.supervisor.refusals import refusal
from forklift.supervisor.snapshot import SnapshotBoard

log = logging.getLogger(__name__)

REFRESH_EVERY = 1.0  # the database is read for the probes this often (on the database thread)
STALE_AFTER = 10.0  # an answer older than this is no answer (the refresher is stuck)
STALLED_AFTER = 10.0  # a loop silent this long fails /healthz

T = TypeVar("T")


@dataclass(frozen=True)
class _Cached(Generic[T]):
    value: T | None = None  # None: the read failed (or none was made yet)
    at: float = float("-inf")

    def fresh(self, now: float) -> T | None:
        return self.value if now - self.at <= STALE_AFTER else None


class Probes:
    """Health and readiness answers from memory; `refresh()` reads the database for them."""

    def __init__(self, board: SnapshotBoard, admin: AdminStore, queues: Sequence[str] = ()) -> None:
        self.board = board
        self.admin = admin
        self.queues = tuple(queues)  # served here: the only queues with gauges
        self._stats: _Cached[list[QueueStats]] = _Cached()
        self._db_ready: _Cached[bool] = _Cached()
        self._db_problem = "database has not answered yet"
        self._prefetched: list[Prefetched] = []
        self._said = Repeats()  # the same database problem again: every 30 s

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
            reasons.append(self._database_problem())
        if reasons:
            return 503, "not ready: " + "; ".join(reasons) + "\n"
        return 200, "ready\n"

    def queue_stats(self) -> list[QueueStats] | None:
        """The served queues' counts as last read; None while the database is away."""
        return self._stats.fresh(time.monotonic())

    def database_ready(self) -> bool:
        """Whether the database answered the last ping, at most STALE_AFTER ago."""
        return bool(self._db_ready.fresh(time.monotonic()))

    def _database_problem(self) -> str:
        age = time.monotonic() - self._db_ready.at
        if self._db_ready.value and age > STALE_AFTER:
            return f"database not checked for {age:.0f} s"
        return self._db_problem

    def prefetch(self, collector: Collector) -> Prefetched:
        """`collector` (which may read the database) collected by `refresh()`, not by a
        scrape."""
        wrapped = Prefetched(collector)
        self._prefetched.append(wrapped)
        return wrapped

    def refresh(self) -> None:
        """Ping the database and, if it answers, read the prefetched collectors (the
        database thread's work, every REFRESH_EVERY s); logs a change of reachability
        only."""
        if not self._ping():
            self._stats = _Cached(None, time.monotonic())
            return
        for collector in self._prefetched:
            collector.refresh()

    def refresh_stats(self) -> None:
        """Read the served queues' counts if the database answered the last ping (the
        database thread's work too, paced: under a held horizon the counts walk more
        dead versions every second)."""
        if self.database_ready():
            self._read_stats()

    def _ping(self) -> bool:
        before = self._db_ready.value
        try:
            self.admin.ping()
        except DatabaseError as exc:
            missing = isinstance(exc, SchemaMissing)
            problem = str(exc) if missing else _unreachable(exc)
            again = self._said.worth_logging(exc)
            # Tables missing: the database thread says so, once for every service.
            refused = refusal(exc)
            if refused is not None:  # no retry fixes it: an operator must, so said loudly
                problem = f"database refuses forklift: {refused}"
            if not missing and (before is not False or problem != self._db_problem or again):
                if refused is not None:
                    emit(log, "supervisor.database_refuses", logging.ERROR, error=refused)
                else:
                    emit(log, "supervisor.database_unreachable", logging.WARNING, error=exc)
            self._db_problem = problem
            self._db_ready = _Cached(False, time.monotonic())
            return False
        if before is False:
            emit(log, "supervisor.database_reachable")
        self._db_ready = _Cached(True, time.monotonic())
        return True

    def _read_stats(self) -> None:
        try:
            stats = self.admin.queue_stats(throughput=False, include=self.queues)
        except DatabaseError as exc:
            emit(log, "metrics.queue_stats_failed", logging.WARNING, error=exc)
            self._stats = _Cached(None, time.monotonic())
            return
        # The jobs table may hold any number of queues nobody here serves: their labels
        # would grow /metrics without bound, and another replica reports them anyway.
        served = set(self.queues)
        self._stats = _Cached([s for s in stats if s.queue in served], time.monotonic())


def metrics_registry(totals: Totals, probes: Probes, *more: Collector) -> CollectorRegistry:
    """What /metrics serves: the children's summed counters, the live gauges, and `more`
    (the scheduler's, which reads the database: collected by `probes.refresh()`). A scrape
    reads memory only."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TotalsCollector(totals))
    registry.register(LiveCollector(probes))
    for collector in more:
        registry.register(probes.prefetch(collector))
    return registry


class Prefetched(Collector):
    """Another collector's metrics as of its last `refresh()` (none before the first)."""

    def __init__(self, collector: Collector) -> None:
        self.collector = collector
        self._metrics: tuple[Metric, ...] = ()

    def refresh(self) -> None:
        self._metrics = tuple(self.collector.collect())

    def collect(self) -> Iterator[Metric]:
        return iter(self._metrics)


class LiveCollector(Collector):
    """Gauges of the served queues (the probes' cached counts and limits) and of the
    workers (the snapshot)."""

    def __init__(self, probes: Probes) -> None:
        self.probes = probes

    def collect(self) -> Iterator[Metric]:
        stats = self.probes.queue_stats() or []
        yield from self._queue_gauges(stats)
        yield from self._limit_metrics(stats)
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
        unrunnable = GaugeMetricFamily(
            "forklift_queue_unrunnable",
            "Ready jobs that require labels no registered worker of the queue has.",
            labels=["queue"],
        )
        for s in stats:
            for state, n in (
                ("ready", s.ready),
                ("scheduled", s.scheduled),
                ("running", s.running),
                ("dead", s.dead),
                ("blocked", s.blocked),
            ):
                depth.add_metric([s.queue, state], n)
            oldest.add_metric([s.queue], s.oldest_ready_age or 0.0)
            paused.add_metric([s.queue], 1 if s.paused else 0)
            unrunnable.add_metric([s.queue], s.unrunnable)
        yield depth
        yield oldest
        yield paused
        yield unrunnable

    @staticmethod
    def _limit_metrics(stats: list[QueueStats]) -> Iterator[Metric]:
        """The served queues' limits (a queue without one of them has no series of that
        kind) and the enqueues their max_depth refused, as the limits table holds them."""
        limit = GaugeMetricFamily(
            "forklift_queue_limit",
            "A queue's limits (forklift queues limit), by kind: concurrency, "
            "rate_per_second, max_depth.",
            labels=["queue", "kind"],
        )
        rejected = CounterMetricFamily(
            "forklift_enqueue_rejected",
            "Enqueues refused by the queue's max_depth.",
            labels=["queue"],
        )
        for s in stats:
            if s.concurrency is not None:
                limit.add_metric([s.queue, "concurrency"], s.concurrency)
            if s.rate is not None and s.per:
                limit.add_metric([s.queue, "rate_per_second"], s.rate / s.per)
            if s.max_depth is not None:
                limit.add_metric([s.queue, "max_depth"], s.max_depth)
            rejected.add_metric([s.queue], s.rejected)
        yield limit
        yield rejected


# What PostgreSQL says when it takes no more connections (max_connections, reserved
# slots, a role's or a database's CONNECTION LIMIT): the supervisor's own connections
# and its workers' may well go on working, so readiness says that, not "unreachable".
_FULL = ("too many connections", "remaining connection slots", "connection limit")


def _unreachable(exc: DatabaseError) -> str:
    text = str(exc).lower()
    if any(sign in text for sign in _FULL):
        return "database refuses new connections (max_connections or a CONNECTION LIMIT reached)"
    return "database unreachable"
