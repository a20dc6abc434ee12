"""Tally (a worker's counts since its last report) and Totals (the supervisor's sums)."""

from __future__ import annotations

import json

import pytest

from forklift.metrics import DURATION_BUCKETS, Tally, Totals, TotalsCollector


def test_take_returns_nothing_when_nothing_happened_and_resets_after() -> None:
    tally = Tally()
    assert tally.take() is None
    tally.renewed(1)
    assert tally.take() == {"jobs": [], "durations": [], "waits": [], "renewals": 1}
    assert tally.take() is None


def test_deltas_survive_json_and_add_up_across_children() -> None:
    totals = Totals()
    for _ in range(2):  # two children, each reporting once
        tally = Tally()
        tally.job("default", "render", "succeeded", 0.3)
        tally.job("default", "render", "failed", None)
        deltas = tally.take()
        assert deltas is not None
        totals.add(json.loads(json.dumps(deltas)))
    assert totals.jobs == {
        ("default", "render", "succeeded"): 2,
        ("default", "render", "failed"): 2,
    }
    histo = totals.durations[("default", "render")]
    assert sum(histo.counts) == 2 and histo.total == 0.6
    assert histo.counts[DURATION_BUCKETS.index(0.5)] == 2


def test_the_collector_exposes_the_totals() -> None:
    totals = Totals()
    totals.add({"jobs": [["default", "noop", "succeeded", 5]], "renewals": 2})
    totals.restart("crash")
    families = {f.name: f for f in TotalsCollector(totals).collect()}
    jobs = families["forklift_jobs"].samples
    assert [(s.labels["outcome"], s.value) for s in jobs] == [("succeeded", 5)]
    assert families["forklift_lease_renewals"].samples[0].value == 2
    assert families["forklift_worker_restarts"].samples[0].labels == {"reason": "crash"}


def test_a_malformed_delta_adds_nothing() -> None:
    totals = Totals()
    good = [["default", "noop", "succeeded", 1]]
    for bad in (
        {"jobs": good, "renewals": "many"},
        {"jobs": good, "durations": [["default", "noop", [[1], "x"]]]},
        {"jobs": good, "waits": [["default"]]},
    ):
        with pytest.raises((ValueError, TypeError)):
            totals.add(bad)
    assert totals.jobs == {} and totals.durations == {} and totals.renewals == 0
