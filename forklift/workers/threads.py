"""The executor threads of one worker: plain def handlers, one job per thread at a time.

Threads start as jobs need them, up to the worker's concurrency: a worker whose
handlers are async (--concurrency 200 on the event loop) starts none, one of plain
handlers as many as run at once.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

from forklift.workers.context import JobContext

log = logging.getLogger("forklift.workers.worker")


class ExecutorThreads:
    """Runs `run(ctx)` for each job submitted, on at most `size` threads."""

    def __init__(self, size: int, run: Callable[[JobContext], None]) -> None:
        self.size = size
        self._run = run
        self._queue: queue.SimpleQueue[JobContext | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._started = 0
        self._idle = 0  # threads waiting for a job
        self._queued = 0  # jobs submitted and not yet taken by a thread

    @property
    def started(self) -> int:
        return self._started

    def submit(self, ctx: JobContext) -> None:
        """Queue a job for a thread; start one more if none is free for it."""
        with self._lock:
            self._queued += 1
            grow = self._queued > self._idle and self._started < self.size
            if grow:
                self._started += 1
                name = f"forklift-exec-{self._started - 1}"
        self._queue.put(ctx)
        if grow:
            threading.Thread(target=self._loop, name=name, daemon=True).start()

    def stop(self) -> None:
        """Make every thread return once it has finished its job."""
        with self._lock:
            started = self._started
        for _ in range(started):
            self._queue.put(None)

    def _loop(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            ctx = self._queue.get()
            with self._lock:
                self._idle -= 1
                if ctx is not None:
                    self._queued -= 1
            if ctx is None:
                return
            self._run(ctx)
