"""The report pipe: what a child writes, and what the parent makes of it."""

from __future__ import annotations

import os

import pytest

from forklift.metrics import Tally, Totals
from forklift.supervisor.child import Child, RunningJob
from forklift.supervisor.reports import (
    Heartbeat,
    JobCancelled,
    JobEnded,
    JobStarted,
    MetricDeltas,
    Report,
    Reporter,
    encode,
    parse_line,
)
from tests.unit.supervisor.conftest import OpenPipe


@pytest.fixture
def pipe(open_pipe: OpenPipe) -> tuple[int, int]:
    return open_pipe()


@pytest.fixture
def child(pipe: tuple[int, int]) -> Child:
    return Child(pid=4242, index=1, owner="host:4242:abc", pipe=pipe[0], started=0.0, last_seen=0.0)


def test_read_with_nothing_written_is_still_open(child: Child) -> None:
    assert child.read(1.0) is True
    assert child.jobs == {} and child.last_seen == 0.0 and not child.reported


def test_heartbeats_set_rss_and_peak_rss(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    Reporter(write_fd).heartbeat(1000)
    Reporter(write_fd).heartbeat(5000)
    Reporter(write_fd).heartbeat(3000)
    assert child.read(7.0) is True
    assert (child.rss, child.peak_rss, child.last_seen) == (3000, 5000, 7.0)
    assert not child.busy and child.reported  # it has said something since its fork


def test_start_and_end_track_jobs_busy_and_idle_since(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    Reporter(write_fd).start(7, 1.5, "render")
    assert child.read(10.0)
    assert child.jobs == {7: RunningJob(7, "render", 10.0, 1.5)}
    assert child.busy and child.idle_since is None and child.last_seen == 10.0

    Reporter(write_fd).start(8, None, "send email")  # a second thread's job; spaces survive
    assert child.read(11.0)
    assert child.jobs[8] == RunningJob(8, "send email", 11.0, None)

    Reporter(write_fd).end(7)
    assert child.read(12.0)
    assert list(child.jobs) == [8]
    assert child.busy and child.idle_since is None  # still running job 8

    Reporter(write_fd).end(8)
    assert child.read(13.0)
    # Busy still: its next job may have started untold, till a heartbeat says none ran.
    assert child.jobs == {} and child.busy and child.idle_since == 13.0
    Reporter(write_fd).heartbeat(4096, ran=0)
    assert child.read(13.5)
    assert not child.busy and child.idle_since == 13.0


def test_a_cancel_is_timed_from_when_it_was_first_heard(
    child: Child, pipe: tuple[int, int]
) -> None:
    Reporter(pipe[1]).start(7, None, "render")
    Reporter(pipe[1]).cancelled(7)
    Reporter(pipe[1]).cancelled(9)  # not running here (ended already): ignored
    assert child.read(10.0)
    Reporter(pipe[1]).cancelled(7)
    assert child.read(11.0)
    assert child.jobs == {7: RunningJob(7, "render", 10.0, None, cancelled=10.0)}


def test_a_long_task_name_is_cut_to_200_characters(child: Child, pipe: tuple[int, int]) -> None:
    Reporter(pipe[1]).start(1, 2, "t" * 5000)
    assert child.read(1.0)
    assert child.jobs[1].task == "t" * 200
    assert child.jobs[1].timeout == 2.0


def test_partial_lines_are_reassembled(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    beat, start, end, beat7 = (
        encode(Heartbeat(1234)),
        encode(JobStarted(9, 2.5, "task")),
        encode(JobEnded(9)),
        encode(Heartbeat(7)),
    )
    os.write(write_fd, beat[:5])
    assert child.read(1.0)
    assert child.rss == 0 and child.last_seen == 0.0  # nothing applied from half a line
    os.write(write_fd, beat[5:] + start[:-3])
    assert child.read(2.0)
    assert child.rss == 1234 and child.jobs == {}
    os.write(write_fd, start[-3:-1])
    assert child.read(3.0)
    assert child.jobs == {}
    os.write(write_fd, start[-1:] + end + beat7[:-1])
    assert child.read(4.0)
    assert child.jobs == {} and child.idle_since == 4.0 and child.rss == 1234
    os.write(write_fd, b"\n")
    assert child.read(5.0)
    assert child.rss == 7 and child.peak_rss == 1234
    assert child.malformed == 0


def test_a_task_name_of_any_characters_survives(child: Child, pipe: tuple[int, int]) -> None:
    name = "café 渲染 \t\x00\u2028 \ud800"
    line = encode(JobStarted(3, None, name))
    assert line.isascii() and line.count(b"\n") == 1 and line.endswith(b"\n")
    for i in range(0, len(line), 3):  # in slices: every cut point is some write's end
        os.write(pipe[1], line[i : i + 3])
        assert child.read(1.0)
    assert child.jobs[3].task == name


def test_many_reports_in_one_read(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    for i in range(1, 501):  # ~52 KB: within the pipe's 64 KiB, so the writes never block
        Reporter(write_fd).start(i, None, "noop")
        Reporter(write_fd).heartbeat(i)
        Reporter(write_fd).end(i)
    assert child.read(1.0)
    assert child.jobs == {} and child.rss == 500 and child.peak_rss == 500


def test_read_returns_false_once_the_write_end_closes(child: Child, pipe: tuple[int, int]) -> None:
    write_fd = pipe[1]
    Reporter(write_fd).start(5, None, "last words")
    os.close(write_fd)
    # What the child wrote before it died is still applied (reap reads once more).
    assert child.read(9.0) is False
    assert 5 in child.jobs
    assert child.read(10.0) is False


def test_read_after_close_returns_false(child: Child) -> None:
    child.close()
    assert child.read(1.0) is False
    child.close()  # closing twice is harmless


def test_report_writers_never_raise_once_the_parent_is_gone(pipe: tuple[int, int]) -> None:
    read_fd, write_fd = pipe
    os.close(read_fd)
    Reporter(write_fd).heartbeat(1)  # EPIPE, swallowed
    Reporter(write_fd).start(1, None, "x")
    Reporter(write_fd).end(1)
    os.close(write_fd)
    Reporter(write_fd).heartbeat(1)  # EBADF, swallowed


def test_overdue_respects_the_timeout() -> None:
    job = RunningJob(1, "render", started=100.0, timeout=2.0)
    assert not job.overdue(101.0)
    assert not job.overdue(102.0)  # exactly at the timeout is not yet overdue
    assert job.overdue(102.01)


def test_a_job_without_a_timeout_is_never_overdue() -> None:
    job = RunningJob(1, "render", started=100.0, timeout=None)
    assert not job.overdue(1e12)


@pytest.mark.parametrize(
    ("line", "report"),
    [
        (b'{"k":"heartbeat","rss":4096}', Heartbeat(4096)),
        (b'{"k":"started","job":7,"timeout":1.5,"task":"render"}', JobStarted(7, 1.5, "render")),
        (b'{"k":"started","job":8,"timeout":2,"task":"a b"}', JobStarted(8, 2.0, "a b")),
        (b'{"k":"started","job":8,"timeout":null,"task":"a b"}', JobStarted(8, None, "a b")),
        (b'{"k":"ended","job":7}', JobEnded(7)),
        (b'{"k":"cancelled","job":7}', JobCancelled(7)),
        (b'{"k":"metrics","deltas":{"renewals":2}}', MetricDeltas({"renewals": 2})),
    ],
)
def test_parse_line(line: bytes, report: Report) -> None:
    assert parse_line(line) == report
    assert encode(report) == line + b"\n" or parse_line(encode(report)[:-1]) == report


@pytest.mark.parametrize(
    "line",
    [
        b"",
        b"nonsense",
        b"heartbeat 4096",  # a word and a number: not JSON, no report
        b'{"k":"heartbeat","rss":"x"}',
        b'{"k":"started","job":1,"timeout":"soon","task":"t"}',
        b'{"k":"started","job":1,"timeout":-1,"task":"t"}',
        b'{"k":"started","job":1,"timeout":Infinity,"task":"t"}',
        b'{"k":"started","job":1,"timeout":1e999,"task":"t"}',
        b'{"k":"started","job":1.5,"timeout":null,"task":"t"}',
        b'{"k":"started","job":1,"timeout":null,"task":5}',
        b'{"k":"ended"}',
        b'{"k":"cancelled"}',
        b'{"k":"cancelled","job":"x"}',
        b'{"k":"metrics","deltas":[1,2]}',
        b'{"k":"reboot"}',
        b'{"k":["heartbeat"]}',
        b'"heartbeat"',
        '{"k":"ended","job":1,"x":"é"}'.encode(),  # never written: not ASCII
    ],
)
def test_a_line_that_is_no_report_parses_to_none(line: bytes) -> None:
    assert parse_line(line) is None


def test_a_torn_line_is_a_sign_of_life_and_nothing_else(
    child: Child, pipe: tuple[int, int]
) -> None:
    torn = encode(JobEnded(1))[:-4] + b"\n"
    os.write(pipe[1], encode(JobStarted(1, None, "ok")) + torn + b"heartbeat\xff\n")
    assert child.read(3.0)
    assert list(child.jobs) == [1] and child.last_seen == 3.0 and child.rss == 0
    assert child.malformed == 2


def test_metric_deltas_reach_the_totals_with_their_names(pipe: tuple[int, int]) -> None:
    totals = Totals()
    child = Child(4242, 1, "h:4242:a", pipe[0], 0.0, 0.0, on_metrics=totals.add)
    tally = Tally()
    tally.job("default", "render", "succeeded", 0.2)
    tally.wait("default", 0.01)
    tally.renewed(3)
    deltas = tally.take()
    assert deltas is not None and set(deltas) == {"jobs", "durations", "waits", "renewals"}
    Reporter(pipe[1]).metrics(deltas)
    os.write(pipe[1], b'{"k": "metrics", "deltas": {"jobs": [["q", "t"]]}}\n')  # malformed
    assert child.read(1.0)
    assert totals.jobs == {("default", "render", "succeeded"): 1}
    assert totals.renewals == 3
    assert sum(totals.durations[("default", "render")].counts) == 1
    assert child.malformed == 1
    assert sum(totals.waits["default"].counts) == 1


def test_a_heartbeat_counting_untold_jobs_makes_the_child_busy_not_idle(
    child: Child, pipe: tuple[int, int]
) -> None:
    os.write(pipe[1], encode(Heartbeat(100, ran=250)))
    assert child.read(5.0)
    assert child.busy and child.idle_since == 5.0
    os.write(pipe[1], encode(Heartbeat(100, ran=0)))
    assert child.read(6.0)
    assert not child.busy and child.idle_since == 5.0  # idle since its last job ended
