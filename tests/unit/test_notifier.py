"""The notifier's choice between notifying in the enqueue's transaction and after it, and
the process's one sender per database (store/_notifier.py), over a recorded stand-in for the
pool's connections; that a quiet enqueue really wakes a LISTENer is
tests/integration/test_enqueue.py."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from forklift.store import _notifier
from forklift.store._notifier import Notifier
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
    notifier = Notifier(db.connection, "wake", db)
    with notifier.enqueuing(["a"]) as quiet:
        assert quiet is False
    notifier.close()
    assert db.sent == []


def test_a_bulk_or_concurrent_enqueue_is_quiet_and_woken_after_its_commit() -> None:
    db = Recorded()
    notifier = Notifier(db.connection, "wake", db)
    with notifier.enqueuing(["a"]) as alone:
        with notifier.enqueuing(["b"]) as beside:  # another thread's, in the meantime
            assert (alone, beside) == (False, True)
            assert db.sent == []  # not before it committed
        wait_for(lambda: db.sent == [["b"]], timeout=5, what="the wake after the commit")
    with notifier.enqueuing(["c", "d"], bulk=True) as quiet:
        assert quiet is True
    notifier.close()
    assert db.sent == [["b"], ["c", "d"]]


def test_a_failed_enqueue_wakes_nobody() -> None:
    db = Recorded()
    notifier = Notifier(db.connection, "wake", db)
    with pytest.raises(RuntimeError), notifier.enqueuing(["a"], bulk=True):
        raise RuntimeError("the insert failed")
    notifier.close()
    assert db.sent == []


def test_wakes_that_come_while_one_is_on_the_wire_go_out_together_and_close_sends_them() -> None:
    db = Recorded()
    notifier = Notifier(db.connection, "wake", db)
    db.gate.clear()  # the first wake hangs on the wire
    notifier.wake(["a"])
    wait_for(lambda: notifier._sender()._sending, timeout=5, what="the first wake on the wire")
    for queue in ("b", "c", "b"):
        notifier.wake([queue])
    db.gate.set()
    notifier.close()
    assert db.sent == [["a"], ["b", "c"]]


def test_wakes_asked_for_without_pause_go_out_one_wake_every_few_ms_and_none_is_lost() -> None:
    # Sends start at least WAKE_EVERY apart, so there are at most elapsed / WAKE_EVERY + 1
    # of them (a bound on the count, not on the times the stand-in sees, which also hold
    # its wait for the GIL). The asking loop lets the sender run after every ask: unspaced,
    # a send to the stand-in takes microseconds and there would be thousands.
    db = Recorded()
    notifier = Notifier(db.connection, "wake", db)
    asked = 0
    began = time.monotonic()
    while time.monotonic() < began + 0.2:  # a busy producer: a wake after every enqueue
        notifier.wake([f"q{asked % 3}"])
        asked += 1
        time.sleep(0)  # the GIL to the sender now, not at the next switch interval
    notifier.close()
    elapsed = time.monotonic() - began
    assert 1 < len(db.sent) <= elapsed / _notifier.WAKE_EVERY + 1, (len(db.sent), elapsed)
    assert asked > 10 * len(db.sent)  # most asks rode along with another's wake
    assert set().union(*db.sent) == {"q0", "q1", "q2"}
    assert not notifier._sender()._pending  # the last asks went out at close


def test_the_apps_of_one_database_wake_together_on_the_connection_at_hand() -> None:
    """Two Apps (two pools) on one database: what both ask for while a wake is on the
    wire goes out once, on the connection of the App that asked last."""
    first, second = Recorded(), Recorded()
    database = object()
    a = Notifier(first.connection, "wake", database)
    b = Notifier(second.connection, "wake", database)
    first.gate.clear()
    a.wake(["a"])
    wait_for(lambda: a._sender()._sending, timeout=5, what="the first wake on the wire")
    a.wake(["b"])
    b.wake(["c"])
    first.gate.set()
    b.close()  # waits for what is pending, though `a` asked for part of it
    assert (first.sent, second.sent) == ([["a"]], [["b", "c"]])
    a.close()


def test_apps_of_different_databases_wake_apart() -> None:
    first, second = Recorded(), Recorded()
    a = Notifier(first.connection, "wake", "dbname=one")
    b = Notifier(second.connection, "wake", "dbname=two")
    a.wake(["a"])
    b.wake(["b"])
    a.close()
    b.close()
    assert (first.sent, second.sent) == ([["a"]], [["b"]])


def test_a_forked_child_wakes_from_a_thread_of_its_own() -> None:
    """The parent's sender thread does not exist in a child: the child starts its own."""
    db = Recorded()
    notifier = Notifier(db.connection, "wake", db)
    notifier.wake(["parent"])
    wait_for(lambda: db.sent == [["parent"]], timeout=5, what="the parent's wake")
    pid = os.fork()
    if pid == 0:  # the child: exit 0 if its wake went out within 5 s
        try:
            notifier.wake(["child"])
            notifier.close(timeout=5)
            os._exit(0 if db.sent == [["parent"], ["child"]] else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    notifier.close()
