"""JobContext.cancelled is a bool, and wait_cancelled() wakes at once on cancel."""

from __future__ import annotations

import threading
import time
from typing import Any, cast

from forklift.store import ClaimedJob, JobStore
from forklift.workers.context import JobContext


def context() -> JobContext:
    job = ClaimedJob(1, "default", "t", {}, None, 0, 1, 5, None)
    return JobContext(job, cast(JobStore, cast(Any, None)))  # cancel needs no store


def test_cancelled_is_false_until_cancel_then_true() -> None:
    ctx = context()
    assert ctx.cancelled is False
    loops = 0
    while not ctx.cancelled:  # the README's polling loop runs until told to stop
        loops += 1
        if loops == 3:
            ctx.cancel()
    assert loops == 3 and ctx.cancelled is True


def test_wait_cancelled_sleeps_the_whole_timeout_when_nobody_cancels() -> None:
    ctx = context()
    started = time.monotonic()
    assert ctx.wait_cancelled(0.2) is False
    assert time.monotonic() - started >= 0.19


def test_wait_cancelled_wakes_when_another_thread_cancels() -> None:
    ctx = context()
    waiting = threading.Event()
    woke: list[tuple[bool, float]] = []

    def wait() -> None:
        waiting.set()
        started = time.monotonic()
        woke.append((ctx.wait_cancelled(30.0), time.monotonic() - started))

    thread = threading.Thread(target=wait)
    thread.start()
    waiting.wait(5)
    ctx.cancel()
    thread.join(5)
    assert woke and woke[0][0] is True and woke[0][1] < 5


def test_wait_cancelled_after_cancel_returns_at_once() -> None:
    ctx = context()
    ctx.cancel()
    assert ctx.wait_cancelled(30.0) is True
