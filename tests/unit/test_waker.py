"""The waker's choice between notifying in the enqueue's transaction and after it
(store/_waker.py), over a recorded stand-in for the pool's connections; that a quiet
enqueue really wakes a LISTENer is tests/integration/test_enqueue.py."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from forklift.store._waker import Waker
from forklift.testing import wait_for


class Recorded:
    def __init__(self) -> None:
        self.sent: list[list[str]] = []
        self.gate = threading.Event()
        self.gate.set()

    @contextmanager
    def connection(self) -> Iterator[Any]:
        yield self

    def execute(self, sql: str, params: dict[str, list[str]]) -> None:
        self.gate.wait(5)
        self.sent.append(params["queues"])


def test_an_enqueue_alone_notifies_in_its_own_transaction() -> None:
    db = Recorded()
    waker = Waker(db.connection, "wake")
    with waker.enqueuing(["a"]) as quiet:
        assert quiet is False
    waker.close()
    assert db.sent == []


def test_a_bulk_or_concurrent_enqueue_is_quiet_and_woken_after_its_commit() -> None:
    db = Recorded()
    waker = Waker(db.connection, "wake")
    with waker.enqueuing(["a"]) as alone:
        with waker.enqueuing(["b"]) as beside:  # another thread's, in the meantime
            assert (alone, beside) == (False, True)
            assert db.sent == []  # not before it committed
        wait_for(lambda: db.sent == [["b"]], timeout=5, what="the wake after the commit")
    with waker.enqueuing(["c", "d"], bulk=True) as quiet:
        assert quiet is True
    waker.close()
    assert db.sent == [["b"], ["c", "d"]]


def test_a_failed_enqueue_wakes_nobody() -> None:
    db = Recorded()
    waker = Waker(db.connection, "wake")
    with pytest.raises(RuntimeError), waker.enqueuing(["a"], bulk=True):
        raise RuntimeError("the insert failed")
    waker.close()
    assert db.sent == []


def test_wakes_that_come_while_one_is_on_the_wire_go_out_together_and_close_sends_them() -> None:
    db = Recorded()
    waker = Waker(db.connection, "wake")
    db.gate.clear()  # the first wake hangs on the wire
    waker.wake(["a"])
    wait_for(lambda: waker._pending == set(), timeout=5, what="the first wake taken")
    for queue in ("b", "c", "b"):
        waker.wake([queue])
    db.gate.set()
    waker.close()
    assert db.sent == [["a"], ["b", "c"]]
