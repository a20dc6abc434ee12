"""The scheduler's metrics: fires by outcome (this replica's counts) and, read from the
database at most every few seconds, each declared schedule's last success.

`forklift_cron_last_success_timestamp_seconds` is the last success of a schedule's job,
or, until its first, when the schedule was first declared; with
`forklift_cron_interval_seconds` (the gap between the fire times around now) an alert
can tell a schedule that has gone silent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from datetime import UTC, datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from forklift._events import emit
from forklift.errors import DatabaseError
from forklift.scheduler.service import Scheduler
from forklift.scheduler.store import ScheduleRow

log = logging.getLogger(__name__)

ROWS_TTL = 2.0  # the schedules table is read at most this often


class CronCollector(Collector):
    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler
        self._rows: list[ScheduleRow] | None = None
        self._read_at = float("-inf")

    def collect(self) -> Iterator[Metric]:
        fires = CounterMetricFamily(
            "forklift_cron_fires",
            "Fire times handled by this replica's scheduler, by outcome.",
            labels=["schedule", "outcome"],
        )
        for (schedule, outcome), n in sorted(self.scheduler.counted().items()):
            fires.add_metric([schedule, outcome], n)
        yield fires
        declared = {s.name: s for s in self.scheduler.schedules}
        success = GaugeMetricFamily(
            "forklift_cron_last_success_timestamp_seconds",
            "When a job of the schedule last succeeded (until its first: when the schedule "
            "was first declared).",
            labels=["schedule"],
        )
        for row in self.rows() or []:
            if row.name in declared:
                when = row.last_success_at or row.created_at
                success.add_metric([row.name], when.timestamp())
        yield success
        interval = GaugeMetricFamily(
            "forklift_cron_interval_seconds",
            "Seconds between the schedule's fire times around now.",
            labels=["schedule"],
        )
        now = datetime.now(UTC)
        for name in sorted(declared):
            seconds = declared[name].interval(now)
            if seconds is not None:
                interval.add_metric([name], seconds)
        yield interval

    def rows(self) -> list[ScheduleRow] | None:
        """The schedules table, at most ROWS_TTL old; None while the database is away."""
        now = time.monotonic()
        if self.scheduler.schedules and now - self._read_at > ROWS_TTL:
            try:
                self._rows = self.scheduler.store.schedule_list()
            except DatabaseError as exc:
                emit(
                    logging.getLogger(__name__),
                    "metrics.schedules_failed",
                    logging.WARNING,
                    error=exc,
                )
                self._rows = None
            self._read_at = now
        return self._rows
