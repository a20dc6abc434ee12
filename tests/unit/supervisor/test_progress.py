"""The supervisor's progress line: while work flows, every `every` seconds; quiet when idle."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import pytest

from forklift.admin import AdminStore, QueueStats
from forklift.metrics import Totals
from forklift.supervisor.progress import ProgressReporter


class FakeAdmin:
    def __init__(self) -> None:
        self.ready = 0

    def queue_stats(
        self, *, throughput: bool = True, include: Sequence[str] = ()
    ) -> list[QueueStats]:
        return [
            QueueStats("default", self.ready, 0, 0, 0, 0.0, 0),
            QueueStats("other", 99, 0, 0, 0, 0.0, 0),  # not served here: not our backlog
        ]


def reporter(totals: Totals, admin: FakeAdmin, now: list[float]) -> ProgressReporter:
    return ProgressReporter(
        totals, cast(AdminStore, cast(Any, admin)), ["default"], every=10.0, clock=lambda: now[0]
    )


def test_a_line_every_interval_while_jobs_finish_and_none_when_idle(
    caplog: pytest.LogCaptureFixture,
) -> None:
    totals, admin, now = Totals(), FakeAdmin(), [0.0]
    progress = reporter(totals, admin, now)
    caplog.set_level(logging.INFO)
    for _ in range(50):
        totals.job("default", "t", "succeeded")
    totals.job("default", "t", "failed")
    admin.ready = 7
    now[0] = 5.0
    assert progress.run_once() is None  # not yet due
    now[0] = 10.0
    line = progress.run_once()
    assert line is not None
    assert (line.done, line.failed, line.dead, line.backlog) == (50, 1, 0, 7)
    assert line.rate == pytest.approx(5.0)
    assert "supervisor.progress done=50 rate=5.0/s failed=1 dead=0 backlog=7" in caplog.text
    admin.ready = 0
    now[0] = 20.0
    assert progress.run_once() is None  # nothing moved and nothing waits: quiet
    assert caplog.text.count("supervisor.progress done=") == 1
