"""What a supervisor's session thread hands its children (HintFanout): a queue's new job
as NEWS on the child's claim-loop self-pipe (its Wakeup), an operator's order as a line
on its hint pipe, read back by the child's PipeSource (no database, no fork: the
parent's copy of a child's self-pipe write end is a dup here)."""

from __future__ import annotations

import os

from forklift.supervisor.session import ORDER, QUEUE, HintFanout
from forklift.workers.listener import PipeSource
from forklift.workers.wakeup import Wakeup


def test_news_wakes_each_claim_loop_and_orders_reach_each_listener() -> None:
    fanout = HintFanout()
    children = []
    for _ in range(2):
        hint_read, hint_write = os.pipe()
        wake_read, wake_write = os.pipe()
        fanout.add(hint_write, os.dup(wake_write))
        children.append((hint_read, hint_write, Wakeup((wake_read, wake_write))))
    fanout.send(QUEUE, "default")
    fanout.send(ORDER, "cancel 7 1")
    fanout.send(QUEUE, "")  # after a reconnect: look now
    for hint_read, _, wakeup in children:
        assert wakeup.wait_for_news(1.0)  # the news, as a Wakeup reads it
        assert not wakeup.wait(0.0)  # and nothing else: the order went to the listener
        source = PipeSource(hint_read, "forklift")
        assert list(source.wait(1.0)) == [(source.control, "cancel 7 1")]
    hint_read, hint_write, wakeup = children[0]
    fanout.remove(hint_write)  # closed by the fanout: the child sees the end of its pipe
    assert list(PipeSource(hint_read, "forklift").wait(0.1)) == []
    fanout.send(QUEUE, "default")  # the news goes to the child still there only
    assert not wakeup.wait(0.1)
    assert children[1][2].wait_for_news(1.0)
    fanout.remove(children[1][1])
    for hint_read, _, wakeup in children:
        os.close(hint_read)
        wakeup.close()


def test_a_full_pipe_drops_the_hint_rather_than_block() -> None:
    fanout = HintFanout()
    hint_read, hint_write = os.pipe()
    wake_read, wake_write = os.pipe()
    fanout.add(hint_write, wake_write)
    for _ in range(70_000):  # far past either pipe's buffer: never blocks
        fanout.send(QUEUE, "default")
        fanout.send(ORDER, "cancel 7 1")
    os.close(hint_read)
    os.close(wake_read)
    fanout.send(QUEUE, "default")  # a child gone: no error either
    fanout.send(ORDER, "cancel 7 1")
    fanout.remove(hint_write)
