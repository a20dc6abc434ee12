"""Totals as Prometheus metric families: forklift_jobs_total, the duration and wait
histograms, renewals, restarts, batches, malformed reports (the supervisor's /metrics;
apart from metrics.py, so that a worker never imports prometheus_client)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from forklift.metrics import (
    BATCH_OUTCOMES,
    CALLBACK_BUCKETS,
    DURATION_BUCKETS,
    WAIT_BUCKETS,
    Histo,
    Totals,
)


def _histogram(
    name: str,
    doc: str,
    labels: list[str],
    bounds: tuple[float, ...],
    series: dict[Any, Histo],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=labels)
    for key, h in sorted(series.items()):
        values = list(key) if isinstance(key, tuple) else [key]
        running, buckets = 0, []
        for bound, n in zip((*bounds, float("inf")), h.counts, strict=True):
            running += n
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
        family.add_metric(values, buckets, h.total)
    return family


class TotalsCollector(Collector):
    """Exposes Totals as forklift_jobs_total, forklift_job_duration_seconds, ..."""

    def __init__(self, totals: Totals) -> None:
        self.totals = totals

    def collect(self) -> Iterator[Metric]:
        t = self.totals
        with t.lock:
            jobs = dict(t.jobs)
            durations = {k: Histo(list(h.counts), h.total) for k, h in t.durations.items()}
            waits = {k: Histo(list(h.counts), h.total) for k, h in t.waits.items()}
            renewals = t.renewals
            restarts = dict(t.restarts)
            malformed = t.malformed_reports
            batches = dict(t.batches)
            delays = Histo(list(t.callback_delays.counts), t.callback_delays.total)
            resumes = dict(t.resumes)
        family = CounterMetricFamily(
            "forklift_jobs", "Job attempts by outcome.", labels=["queue", "task", "outcome"]
        )
        for (q, task, outcome), n in sorted(jobs.items()):
            family.add_metric([q, task, outcome], n)
        yield family
        yield _histogram(
            "forklift_job_duration_seconds",
            "Handler run time.",
            ["queue", "task"],
            DURATION_BUCKETS,
            durations,
        )
        yield _histogram(
            "forklift_job_wait_seconds",
            "Time from a job becoming available to its start.",
            ["queue"],
            WAIT_BUCKETS,
            waits,
        )
        yield CounterMetricFamily("forklift_lease_renewals", "Leases renewed.", value=renewals)
        family = CounterMetricFamily(
            "forklift_worker_restarts",
            "Worker processes replaced, by reason.",
            labels=["reason"],
        )
        for reason, n in sorted(restarts.items()):
            family.add_metric([reason], n)
        yield family
        family = CounterMetricFamily(
            "forklift_batches", "Batches finished, by outcome.", labels=["outcome"]
        )
        for outcome in BATCH_OUTCOMES:
            family.add_metric([outcome], batches.get(outcome, 0))
        yield family
        yield _histogram(
            "forklift_batch_callback_delay_seconds",
            "Time from a batch's last job's end to its callback's enqueue.",
            [],
            CALLBACK_BUCKETS,
            {(): delays},
        )
        yield from _resumes(resumes)
        yield CounterMetricFamily(
            "forklift_malformed_reports",
            "Reports from worker processes that could not be read (dropped).",
            value=malformed,
        )


def _resumes(resumes: dict[tuple[str, str], tuple[int, float]]) -> Iterator[Metric]:
    """forklift_job_resumes_total and the seconds of work those resumes did not redo."""
    count = CounterMetricFamily(
        "forklift_job_resumes",
        "Attempts that resumed from a checkpoint (ctx.checkpoint, ctx.iterate, ctx.step).",
        labels=["queue", "task"],
    )
    saved = CounterMetricFamily(
        "forklift_job_resumed_work_seconds",
        "Seconds of work the checkpoints resumed from stood for: work not done again.",
        labels=["queue", "task"],
    )
    for (q, task), (n, seconds) in sorted(resumes.items()):
        count.add_metric([q, task], n)
        saved.add_metric([q, task], seconds)
    yield count
    yield saved
