"""How `forklift batches` reads a batch's numbers (done, percent, rate, ETA, state) and
how a job's progress reads, from rows alone: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from forklift.admin.batches import BatchSummary
from forklift.admin.rows import Progress
from forklift.shown import output
from forklift.store.batches import BatchCounts, BatchRow

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def summary(
    total: int, by_state: dict[str, int], *, age: float = 100.0, sealed: bool = True,
    finished_after: float | None = None,
) -> BatchSummary:  # fmt: skip
    created = NOW - timedelta(seconds=age)
    finished = None if finished_after is None else created + timedelta(seconds=finished_after)
    row = BatchRow(
        1, total, "assemble", None, None, created, created if sealed else None, None, None,
        finished, NOW, None,
    )  # fmt: skip
    return BatchSummary(row, BatchCounts(by_state, 0.0, 0.0, None))


def test_an_open_batch_is_as_far_as_its_ended_jobs_and_its_eta_follows_its_rate() -> None:
    s = summary(100, {"ready": 30, "running": 10, "succeeded": 55, "dead": 5}, age=120.0)
    assert (s.state, s.pending, s.done, s.percent) == ("open", 40, 60, 60.0)
    assert s.rate == 0.5 and s.eta == 80.0  # 60 ended in 120 s; 40 left at 0.5/s


def test_a_batch_with_nothing_ended_has_no_rate_and_no_eta() -> None:
    s = summary(10, {"ready": 10}, sealed=False)
    assert (s.state, s.done, s.rate, s.eta) == ("filling", 0, None, None)
    assert summary(0, {}).percent is None  # a batch of none is no percent of anything


def test_a_finished_batch_rates_over_its_life_and_has_no_eta() -> None:
    s = summary(50, {"succeeded": 40, "cancelled": 10}, age=600.0, finished_after=25.0)
    assert (s.state, s.percent, s.rate, s.eta, s.age) == ("finished", 100.0, 2.0, None, 600.0)
    # Its ended jobs purged early still count as done: only open jobs are left to do.
    assert summary(50, {"succeeded": 5}, finished_after=25.0).done == 50


def test_progress_reads_what_the_column_holds_and_nothing_else() -> None:
    p = Progress.of({"done": 12, "total": 300, "message": "resizing", "at": NOW.isoformat()})
    assert p == Progress(12, 300, "resizing", NOW) and p.percent == 4.0
    assert Progress.of({"done": 3}) == Progress(3, None, None, None)
    assert Progress.of({"done": 1, "at": "2026-12-01T12:00:00"}) == Progress(1, None, None, NOW)
    junk: list[Any] = [None, [], {"total": 3}, {"done": "3"}, {"done": True}]
    assert [Progress.of(j) for j in junk] == [None] * len(junk)
    assert Progress.of({"done": 1, "total": "x", "at": "soon"}) == Progress(1, None, None, None)


def test_numbers_and_fractions_read_as_people_write_them() -> None:
    assert [output.number(v) for v in (12, 12.0, 0.25, 3.14159, 1234567.0, 1234.5)] == [
        "12", "12", "0.25", "3.14", "1234567", "1234",
    ]  # fmt: skip
    assert output.fraction(12, 300) == "12/300 (4%)" and output.fraction(7, None) == "7"
    assert output.fraction(2999, 3000) == "2999/3000 (99%)"  # never 100% before it is
    assert output.percent(None) == "-"
