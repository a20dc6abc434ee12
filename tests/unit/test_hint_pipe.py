"""The hints a supervisor's session thread hands its children over a pipe: written by
HintFanout, read back by the child's PipeSource (no database, no fork)."""

from __future__ import annotations

import os

from forklift.supervisor.session import ORDER, QUEUE, HintFanout
from forklift.workers.listener import PipeSource


def test_hints_reach_each_child_pipe_as_channel_and_payload() -> None:
    fanout = HintFanout()
    ends = [os.pipe() for _ in range(2)]
    for _, write in ends:
        fanout.add(write)
    fanout.send(QUEUE, "default")
    fanout.send(ORDER, "cancel 7 1")
    fanout.send(QUEUE, "")  # after a reconnect: look now
    for read, _ in ends:
        source = PipeSource(read, "forklift")
        got = list(source.wait(1.0))
        assert got == [
            (source.channel, "default"),
            (source.control, "cancel 7 1"),
            (source.channel, ""),
        ]
    read, write = ends[0]
    fanout.remove(write)  # closed by the fanout: the child sees the end of its pipe
    assert list(PipeSource(read, "forklift").wait(0.1)) == []
    for read, _ in ends:
        os.close(read)
    fanout.remove(ends[1][1])


def test_a_full_pipe_drops_the_hint_rather_than_block() -> None:
    fanout = HintFanout()
    read, write = os.pipe()
    fanout.add(write)
    for _ in range(20_000):  # far past the pipe's buffer: never blocks
        fanout.send(QUEUE, "default")
    os.close(read)
    fanout.send(QUEUE, "default")  # a child gone: no error either
    fanout.remove(write)
