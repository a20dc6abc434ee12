"""A child's job hooks: which job starts and ends reach the parent, and when."""

from __future__ import annotations

import os

import pytest

import forklift
from forklift.store import ClaimedJob
from forklift.supervisor.boot import JobHooks
from forklift.supervisor.reports import (
    JobCancelled,
    JobEnded,
    JobStarted,
    Report,
    Reporter,
    parse_line,
)
from forklift.supervisor.title import ChildTitle
from tests.unit.supervisor.conftest import OpenPipe

app = forklift.App(schema="t_unit")


@app.task(timeout=30)
def timed(ctx: forklift.JobContext) -> None:
    pass


@app.task()
def untimed(ctx: forklift.JobContext) -> None:
    pass


def job(job_id: int, task: str) -> ClaimedJob:
    return ClaimedJob(job_id, "default", task, {}, None, 0, 1, 3, None)


class Sent:
    """The reports a child wrote into the pipe, read back as the parent reads them."""

    def __init__(self, read_fd: int) -> None:
        self.read_fd = read_fd

    def take(self) -> list[Report]:
        try:
            data = os.read(self.read_fd, 1 << 16)
        except BlockingIOError:
            return []
        return [r for line in data.splitlines() if (r := parse_line(line)) is not None]


@pytest.fixture
def hooks_and_sent(open_pipe: OpenPipe) -> tuple[JobHooks, Sent, ChildTitle]:
    read_fd, write_fd = open_pipe()
    title = ChildTitle(1, 2, ("default",))
    return JobHooks(app, Reporter(write_fd), title), Sent(read_fd), title


def test_a_job_with_a_timeout_is_told_at_once(
    hooks_and_sent: tuple[JobHooks, Sent, ChildTitle],
) -> None:
    hooks, sent, title = hooks_and_sent
    hooks.started(job(1, "timed"))
    assert sent.take() == [JobStarted(1, 30.0, "timed")]
    hooks.handler(1, True)
    assert "timed#1" in title.text()
    hooks.ended(job(1, "timed"), "succeeded")
    assert sent.take() == [JobEnded(1)]
    assert hooks.flush() == 1


def test_a_job_without_a_timeout_that_ends_between_beats_costs_no_report(
    hooks_and_sent: tuple[JobHooks, Sent, ChildTitle],
) -> None:
    hooks, sent, title = hooks_and_sent
    for job_id in range(1, 101):
        hooks.started(job(job_id, "untimed"))
        hooks.ended(job(job_id, "untimed"), "succeeded")
    assert sent.take() == []
    assert hooks.flush() == 100  # the heartbeat carries the count instead
    assert "untimed" not in title.text()  # shown idle again at the beat
    assert hooks.flush() == 0


def test_a_job_without_a_timeout_still_running_at_the_beat_is_told_then(
    hooks_and_sent: tuple[JobHooks, Sent, ChildTitle],
) -> None:
    hooks, sent, title = hooks_and_sent
    hooks.started(job(7, "untimed"))
    hooks.handler(7, True)
    assert sent.take() == []
    assert "untimed#7" in title.text()  # the title says it at once, whatever the beat
    assert hooks.flush() == 0
    assert sent.take() == [JobStarted(7, None, "untimed")]
    hooks.ended(job(7, "untimed"), "succeeded")
    assert sent.take() == [JobEnded(7)]  # told it started, so told it ended
    assert "untimed" not in title.text()


def test_cancelling_an_untold_job_tells_its_start_first(
    hooks_and_sent: tuple[JobHooks, Sent, ChildTitle],
) -> None:
    hooks, sent, _ = hooks_and_sent
    hooks.started(job(9, "untimed"))
    hooks.cancelled(job(9, "untimed"))
    # The parent times its cancel grace from the job it knows is running.
    assert sent.take() == [JobStarted(9, None, "untimed"), JobCancelled(9)]
    hooks.ended(job(9, "untimed"), "cancelled")
    assert sent.take() == [JobEnded(9)]
    assert hooks.flush() == 1


def test_the_title_names_a_job_from_its_handlers_call_on_as_a_death_is_charged(
    hooks_and_sent: tuple[JobHooks, Sent, ChildTitle],
) -> None:
    # `ps` names only a job a death of the worker would be charged to (running.py): not
    # one started but whose handler is not called yet, nor one refused before its call.
    hooks, _, title = hooks_and_sent
    hooks.started(job(3, "untimed"))
    assert title.text().endswith(": idle")
    hooks.handler(3, True)
    assert title.text().endswith(": running untimed#3")
    hooks.handler(3, False)
    hooks.ended(job(3, "untimed"), "succeeded")
    hooks.started(job(4, "nosuchtask"))
    hooks.ended(job(4, "nosuchtask"), "failed")  # refused: its handler never called
    hooks.flush()
    assert title.text().endswith(": idle")


@pytest.mark.parametrize("task", ["timed", "untimed"])
def test_the_title_stops_naming_a_job_as_its_handler_returns(
    hooks_and_sent: tuple[JobHooks, Sent, ChildTitle], task: str
) -> None:
    """`ps` names the jobs a death would be charged to: once the handler returned, a kill
    is no longer charged to the job, so the title (what `ps` shows) must not name it
    while its outcome waits for its write."""
    hooks, _, title = hooks_and_sent
    hooks.started(job(7, task))
    hooks.handler(7, True)
    assert f"{task}#7" in title._shown  # what was last set as the process title
    hooks.handler(7, False)
    assert f"{task}#7" not in title._shown
    assert f"{task}#7" not in title.text()
