"""wait_for_end's loop, with a listener that hears nothing (no database, no thread)."""

from __future__ import annotations

import threading

import pytest

from forklift import _waiting
from forklift.errors import DatabaseError
from forklift.testing import wait_for


def deaf() -> _waiting.Ends:
    return _waiting.Ends("postgresql://nowhere/x", deaf=True)


def test_a_wait_reads_until_the_answer_and_marks_once() -> None:
    answers = iter([None, None, None, "done"])
    marks: list[int] = []
    ends = deaf()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_waiting, "POLL", 0.01)
        found = _waiting.wait_for_end(
            ends, "s", "j1", lambda: next(answers), 5.0, lambda: marks.append(1)
        )
    assert found == "done" and marks == [1]
    assert not ends.heard("s") and ends._waiters == {}  # unregistered after


def test_the_first_read_s_database_error_is_raised_at_once() -> None:
    def check() -> None:
        raise DatabaseError("waiting failed: the database is away")

    with pytest.raises(DatabaseError):
        _waiting.wait_for_end(deaf(), "s", "j1", check, 30.0)


def test_a_later_database_error_is_read_again_until_the_deadline() -> None:
    calls: list[int] = []

    def check() -> str | None:
        calls.append(1)
        if len(calls) == 1:
            return None
        if len(calls) < 4:
            raise DatabaseError("waiting failed: the database restarts")
        return "back"

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_waiting, "POLL", 0.01)
        assert _waiting.wait_for_end(deaf(), "s", "j1", check, 5.0) == "back"

    def failing() -> str | None:
        if not calls:
            calls.append(1)
            return None
        raise DatabaseError("waiting failed: still away")

    calls.clear()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_waiting, "POLL", 0.01)
        with pytest.raises(DatabaseError, match="still away"):
            _waiting.wait_for_end(deaf(), "s", "j1", failing, 0.1)


def test_a_hint_wakes_its_waiter_before_its_poll() -> None:
    ends = deaf()
    done = threading.Event()
    woken: list[bool] = []

    def check() -> bool | None:
        return True if done.is_set() else None

    def waiter() -> None:
        woken.append(bool(_waiting.wait_for_end(ends, "s", "j7", check, 30.0)))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_waiting, "POLL", 60.0)  # only a hint can wake it in time
        thread = threading.Thread(target=waiter)
        thread.start()
        key = ("s_done", "j7")
        wait_for(lambda: key in ends._waiters, timeout=5, what="the waiter registered")
        done.set()
        for w in ends._waiters[key]:
            w.woken.set()  # as the listener's thread does for a notification
        thread.join(timeout=5)
    assert woken == [True]
