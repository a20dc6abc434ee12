"""`forklift top`'s layout: it fits 80x24 whatever the frame holds, and shows more when
the terminal is bigger; workers come from the registry and from running jobs' owners."""

from __future__ import annotations

import io
from datetime import UTC, datetime

from rich.console import Console

from forklift.admin import ProcessRow, QueueStats
from forklift.admin.rows import DeadJob, Progress, RunningJobRow
from forklift.cli.top.frame import Frame, Trends, Worker, workers_of
from forklift.cli.top.view import render, spark

NOW = datetime(2026, 12, 1, 11, 0, tzinfo=UTC)


def busy_frame() -> Frame:
    queues = [
        QueueStats(f"queue-with-a-very-long-name-{i}", 123456, 999, 64, 4321, 7200.0, 98765,
                   paused=i % 3 == 0)
        for i in range(12)
    ]  # fmt: skip
    workers = [
        Worker(
            f"a-rather-long-host-name.example.com:{4000 + i}:abc", "a-rather-long-host-name",
            4000 + i, [RunningJobRow(10_000 + i, "q", "t" * 80, "h", 1, 5000.0)] if i % 2 else [],
            812 * 2**20,
        )
        for i in range(40)
    ]  # fmt: skip
    failures = [DeadJob(i, "q", "render", 30.0, "RuntimeError: " + "x" * 200) for i in range(5)]
    return Frame(NOW, "root@db.example.com:5432/production schema forklift", queues, workers, 3,
                 failures)  # fmt: skip


def shown(frame: Frame, width: int, height: int) -> list[str]:
    console = Console(width=width, height=height, file=io.StringIO(), record=True)
    trends = Trends()
    for _ in range(20):
        trends.add(frame)
    console.print(render(frame, trends, width, height))
    return console.export_text().rstrip("\n").splitlines()


def test_a_busy_frame_fits_80x24_and_says_what_it_left_out() -> None:
    lines = shown(busy_frame(), 80, 24)
    assert len(lines) <= 24
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    text = "\n".join(lines)
    assert "more not shown" in text and "q quits" in lines[0]
    assert "paused" in text and "Recent failures" in text
    assert "Workers: 40 (20 busy) of 3 supervisors" in text


def test_one_supervisor_is_one_supervisor() -> None:
    text = "\n".join(shown(Frame(NOW, "db", supervisors=1), 80, 24))
    assert "Workers: 0 (0 busy) of 1 supervisor" in text and "supervisors" not in text


def test_a_bigger_terminal_shows_more_rows() -> None:
    small, big = shown(busy_frame(), 80, 24), shown(busy_frame(), 120, 50)
    assert len(big) > len(small) and len(big) <= 50


def test_an_empty_frame_still_has_its_sections() -> None:
    lines = shown(Frame(NOW, "db"), 80, 24)
    assert [line.split(" ")[0] for line in lines if line and line[0].isupper()][:3] == [
        "Queues", "QUEUE", "Workers:",
    ]  # fmt: skip


def test_sparklines_scale_to_their_largest_value() -> None:
    assert spark([0, 1, 2, 4], 11) == "▁▃▅█"
    assert spark([0, 0], 11) == "▁▁" and spark(range(20), 3) == "▇██"  # the last 3


def test_workers_come_from_the_registry_and_from_running_jobs_owners() -> None:
    procs = [
        ProcessRow("h:1:a", "supervisor", "h", 1, None, ["q"], None, None, 9.0, 1.0),
        ProcessRow("h:2:b", "worker", "h", 2, "h:1:a", ["q"], None, 2**20, 9.0, 1.0),
        ProcessRow("h:3:c", "worker", "h", 3, "h:1:a", ["q"], None, None, 9.0, 1.0),
    ]
    running = [
        RunningJobRow(7, "q", "render", "h:3:c", 1, 2.0),
        RunningJobRow(8, "q", "x", "n:9:d", 1, 1),
    ]
    workers = workers_of(procs, running)
    assert [(w.id, [j.id for j in w.jobs], w.registered) for w in workers] == [
        ("h:3:c", [7], True), ("n:9:d", [8], False), ("h:2:b", [], True),
    ]  # fmt: skip
    assert workers[1].pid == 9


def test_a_running_jobs_progress_shows_on_its_row_escaped() -> None:
    jobs = [
        RunningJobRow(7, "q", "render", "h:2:b", 1, 2.0, Progress(37, 100, "tiles\x1b[2J", None)),
        RunningJobRow(8, "q", "count", "h:3:c", 1, 2.0, Progress(12, None, None, None)),
    ]
    workers = [Worker("h:2:b", "h", 2, jobs[:1]), Worker("h:3:c", "h", 3, jobs[1:])]
    wide = shown(Frame(NOW, "db", [], workers), 120, 24)
    [first] = [line for line in wide if "render#7" in line]
    assert first.endswith("37% tiles\\x1b[2J")
    [second] = [line for line in wide if "count#8" in line]
    assert second.endswith(" 12")  # no total: the count done
    narrow = shown(Frame(NOW, "db", [], workers), 80, 24)
    assert any(line.endswith("37% tiles") for line in narrow) and max(map(len, narrow)) <= 80


def test_a_running_jobs_checkpoint_shows_as_its_age_after_its_progress() -> None:
    """`↻12s`: the job has a checkpoint, written 12 s ago; after the percent, before the
    message, so that an 80-column terminal keeps both the percent and the mark."""
    jobs = [
        RunningJobRow(7, "q", "render", "h:2:b", 1, 2.0, Progress(37, 100, "tiles", None), 12.0),
        RunningJobRow(8, "q", "count", "h:3:c", 1, 2.0, None, 150.0),
        RunningJobRow(9, "q", "plain", "h:4:d", 1, 2.0, Progress(37, 100, "tiles", None)),
    ]
    workers = [Worker(f"h:{i}:x", "h", i, [job]) for i, job in enumerate(jobs, 2)]
    wide = shown(Frame(NOW, "db", [], workers), 120, 24)
    [first] = [line for line in wide if "render#7" in line]
    assert first.endswith("  37% ↻12s tiles")
    [second] = [line for line in wide if "count#8" in line]
    assert second.endswith("  ↻2m")  # no progress: the mark alone
    [third] = [line for line in wide if "plain#9" in line]
    assert third.endswith("  37% tiles")  # no checkpoint: no mark
    narrow = shown(Frame(NOW, "db", [], workers), 80, 24)
    [first] = [line for line in narrow if "render#7" in line]
    assert first.rstrip().endswith("  37% ↻12s") and max(map(len, narrow)) <= 80


def test_a_wide_terminal_shows_each_queues_limits_an_80_column_one_does_not() -> None:
    queues = [
        QueueStats("emails", 3, 0, 1, 0, 2.0, 5, concurrency=4, rate=10, per=1.0, rejected=2),
        QueueStats("plain", 1, 0, 0, 0, 1.0, 0),
    ]
    frame = Frame(NOW, "db", queues)
    wide = shown(frame, 120, 24)
    assert any(line.rstrip().endswith("LIMITS") for line in wide)
    [emails] = [line for line in wide if line.startswith("emails ")]
    assert emails.endswith("concurrency 4, 10/1s (2 rejected)")
    [plain] = [line for line in wide if line.startswith("plain ")]
    assert plain.endswith(" -")
    narrow = shown(frame, 80, 24)
    assert not any("LIMITS" in line or "concurrency" in line for line in narrow)
    assert max(map(len, narrow)) <= 80
