"""Tally (a worker's counts since its last report) and Totals (the supervisor's sums)."""

from __future__ import annotations

import json

import pytest

from forklift.metrics import (
    DURATION_BUCKETS,
    MAX_TASK_LABELS,
    OTHER_TASK,
    UNKNOWN_TASK,
    Tally,
    Totals,
)
from forklift.supervisor.exposition import TotalsCollector


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


def series(totals: Totals) -> list[tuple[str, dict[str, str]]]:
    return [(s.name, s.labels) for f in TotalsCollector(totals).collect() for s in f.samples]


def tally_of(names: list[str]) -> Tally:
    tally = Tally()
    for name in names:
        tally.job("default", name, "dead", 0.01)
        tally.wait("default", 0.5)
    return tally


def test_thousands_of_undeclared_task_names_share_one_label() -> None:
    totals = Totals(tasks=["render", "resize"])
    delta = tally_of([f"typo-{i}" for i in range(5000)] + ["render"]).take()
    assert delta is not None
    totals.add(delta)
    totals.job("default", "another-typo", "crashed")
    tasks = {labels["task"] for _, labels in series(totals) if "task" in labels}
    assert tasks == {UNKNOWN_TASK, "render"}
    exposed = len(series(totals))
    assert exposed < 100, exposed
    unknown = totals.jobs[("default", UNKNOWN_TASK, "dead")]
    assert unknown == 5000  # nothing is lost, only folded


def test_past_the_cap_further_task_names_fold_into_other() -> None:
    totals = Totals()  # nothing declared: every name gets a label while there is room
    for i in range(0, 3000, 500):
        delta = tally_of([f"task-{j}" for j in range(i, i + 500)]).take()
        assert delta is not None
        totals.add(delta)
    tasks = {labels["task"] for _, labels in series(totals) if "task" in labels}
    assert len(tasks) == MAX_TASK_LABELS + 1 and OTHER_TASK in tasks
    assert "task-0" in tasks and "task-2999" not in tasks
    assert sum(n for (_, t, _), n in totals.jobs.items()) == 3000
    totals.declare(["late"])  # a reload's declarations do not lift the cap
    totals.job("default", "late", "succeeded")
    assert ("default", OTHER_TASK, "succeeded") in totals.jobs


def test_every_batch_outcome_a_child_reports_is_counted() -> None:
    """An abandoned batch finished by a worker's sweep reaches the supervisor's sums (a
    delta with an outcome it did not know would be refused whole, its jobs with it)."""
    totals = Totals()
    tally = Tally()
    for outcome in ("succeeded", "failed", "cancelled", "abandoned"):
        tally.batch(outcome, 0.01)
    deltas = tally.take()
    assert deltas is not None
    totals.add(json.loads(json.dumps(deltas)))
    assert totals.batches == {"succeeded": 1, "failed": 1, "cancelled": 1, "abandoned": 1}


def test_resumes_and_the_work_they_saved_add_up_across_children_and_are_exposed() -> None:
    totals = Totals()
    for saved in (12.5, 30.0):
        tally = Tally()
        tally.resumed("default", "render", saved)
        deltas = tally.take()
        assert deltas is not None and tally.take() is None
        totals.add(json.loads(json.dumps(deltas)))
    assert totals.resumes == {("default", "render"): (2, 42.5)}
    families = {f.name: f for f in TotalsCollector(totals).collect()}
    assert families["forklift_job_resumes"].samples[0].value == 2
    assert families["forklift_job_resumed_work_seconds"].samples[0].value == 42.5


@pytest.mark.parametrize(
    "bad", [[["q", "t", 1, -1.0]], [["q", "t", 1, "nan"]], [["q", "t", -1, 1]]]
)
def test_a_malformed_resume_adds_nothing(bad: list[list[object]]) -> None:
    totals = Totals()
    with pytest.raises(ValueError):
        totals.add({"resumes": bad})
    assert totals.resumes == {}
