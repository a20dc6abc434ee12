"""The workflows gauge: open workflows, and those that finished in the last hour by
outcome, read from the workflows table when the probes refresh (prefetched: a scrape
reads memory only)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from forklift._events import emit
from forklift._service import Repeats
from forklift.errors import DatabaseError
from forklift.store.workflows import WorkflowStore

log = logging.getLogger(__name__)

WINDOW = 3600.0  # finished workflows are counted over the last this many seconds
STATES = ("running", "succeeded", "failed", "cancelled")


class WorkflowCollector(Collector):
    def __init__(self, store: WorkflowStore) -> None:
        self.store = store
        self._errors = Repeats()

    def collect(self) -> Iterator[Metric]:
        try:
            counts = self.store.counts(WINDOW)
        except DatabaseError as exc:
            if self._errors.worth_logging(exc):
                emit(log, "metrics.workflows_failed", logging.WARNING, error=exc)
            return
        gauge = GaugeMetricFamily(
            "forklift_workflows",
            "Workflows by state: running (not finished), and those that finished in the "
            "last hour by outcome (succeeded, failed, cancelled).",
            labels=["state"],
        )
        for state in STATES:
            gauge.add_metric([state], counts.get(state, 0))
        yield gauge
