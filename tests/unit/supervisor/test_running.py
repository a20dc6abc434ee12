"""The running-handler marks a child shares with its supervisor."""

from __future__ import annotations

from forklift.supervisor import running
from forklift.supervisor.running import RunningHandlers


def test_marks_follow_handlers_and_entries_are_reused() -> None:
    marks = RunningHandlers()
    try:
        assert marks.running() == ()
        for job_id in (5, 9, 7):
            marks.began(job_id)
        marks.returned(9)
        marks.began(11)  # takes 9's entry
        marks.began(5)  # already marked: nothing changes
        marks.returned(404)  # never marked: nothing changes
        assert marks.running() == (5, 7, 11)
        assert marks._used == 3
    finally:
        marks.close()


def test_more_handlers_than_entries_means_it_cannot_tell() -> None:
    marks = RunningHandlers()
    try:
        for job_id in range(1, running.ENTRIES + 2):
            marks.began(job_id)
        assert marks.running() is None  # every job it held is charged, as before
    finally:
        marks.close()


def test_the_parent_ignores_what_no_fence_could_match() -> None:
    marks = RunningHandlers()
    try:
        marks._words[1] = 2**64 - 1  # garbage: not a bigint id
        marks._words[2] = 3
        assert marks.running() == (3,)
    finally:
        marks.close()
