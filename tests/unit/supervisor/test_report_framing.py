"""Nothing a child writes to its report pipe can forge a report or hurt the parent."""

from __future__ import annotations

import os

import pytest

from forklift.metrics import Totals
from forklift.supervisor.child import Child
from forklift.supervisor.reports import Reporter
from tests.unit.supervisor.conftest import OpenPipe


def feed(child: Child, write_fd: int, data: bytes, now: float = 1.0) -> None:
    """Write `data` a pipe-buffer's worth at a time, the parent reading as it comes."""
    for i in range(0, len(data), 16_384):
        os.write(write_fd, data[i : i + 16_384])
        assert child.read(now)


@pytest.fixture
def pipe(open_pipe: OpenPipe) -> tuple[int, int]:
    return open_pipe()


@pytest.fixture
def totals() -> Totals:
    return Totals()


@pytest.fixture
def child(pipe: tuple[int, int], totals: Totals) -> Child:
    return Child(4242, 1, "host:4242:abc", pipe[0], 0.0, 0.0, on_metrics=totals.add)


def test_no_task_name_can_forge_a_report(child: Child, pipe: tuple[int, int]) -> None:
    # Names are checked at enqueue, but a row may come from anywhere (SQL, an old producer).
    evil = 'render\nended 7\nheartbeat 999999\n{"k": "ended", "job": 7}'
    Reporter(pipe[1]).start(7, None, evil)
    assert child.read(1.0)
    assert list(child.jobs) == [7] and child.jobs[7].task == evil
    assert child.rss == 0 and child.malformed == 0


GARBAGE = [
    b"metrics " + b"[" * 100_000 + b"\n",  # deep nesting: RecursionError in json
    b'metrics {"jobs": [["q", "t", "succeeded", 1e400]]}\n',  # int(inf): OverflowError
    b'{"k": "metrics", "deltas": ' + b"[" * 100_000 + b"\n",
    b'{"k": "metrics", "deltas": {"jobs": [["q", "t", "succeeded", 1e400]]}}\n',
    b'{"k": "metrics", "deltas": {"jobs": 5, "renewals": "x"}}\n',
    b'{"k": "started", "job": "7", "timeout": null, "task": "t"}\n',
    b'{"k": "started", "job": 7, "timeout": NaN, "task": "t"}\n',
    b'{"k": "heartbeat", "rss": -1}\n',
    b'{"k": "heartbeat", "rss": true}\n',
    b'{"k": "ended"}\n',
    b"[1, 2, 3]\n",
    b"\xff\xfe\x00 not even text\n",
    b"9" * 10_000 + b"\n",  # past int's digit limit
]


@pytest.mark.parametrize("garbage", GARBAGE, ids=lambda g: repr(g[:40]))
def test_garbage_never_raises_and_is_counted(
    garbage: bytes, child: Child, pipe: tuple[int, int], totals: Totals
) -> None:
    feed(child, pipe[1], garbage)
    Reporter(pipe[1]).heartbeat(123)  # and what comes after it is read as ever
    assert child.read(1.0)
    assert child.rss == 123 and child.jobs == {}
    assert child.malformed == 1
    assert totals.jobs == {} and totals.renewals == 0


def test_a_line_without_end_is_dropped_at_its_limit(child: Child, pipe: tuple[int, int]) -> None:
    # A child spewing bytes with no newline must not grow the parent's buffer forever.
    feed(child, pipe[1], b"x" * 2_500_000 + b"\n")
    Reporter(pipe[1]).heartbeat(5)
    assert child.read(2.0)
    assert child.rss == 5 and child.malformed == 1
