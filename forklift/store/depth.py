"""Backpressure: an enqueue into a queue holding its max_depth of ready and scheduled
jobs (`forklift queues limit Q --max-depth N`) raises QueueFull and inserts nothing.

Which queues have a max_depth is read at most once a second per process, so a new one
is obeyed within a second and a queue without one costs an enqueue a dict lookup. The
depth is counted (up to max_depth, an index-only scan of the ready index) in the
enqueuing transaction's snapshot: producers enqueueing into the same queue at the same
moment do not see each other, so the queue may overshoot by what they add together.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

from forklift import _sql
from forklift.errors import QueueFull
from forklift.store._boundary import Conn
from forklift.store._rows import NewJob

LOOK_EVERY = 1.0  # seconds a process trusts its list of queues with a max_depth


class DepthGuard:
    def __init__(self, connect: Callable[[], AbstractContextManager[Conn]], schema: str) -> None:
        self.connect = connect  # for counting a refusal (the caller's transaction rolls back)
        self.q = _sql.load("forklift.store", "limits.sql", schema)
        self._limits: dict[str, int] = {}
        self._read_at = -LOOK_EVERY

    def check(self, conn: Conn, jobs: Sequence[NewJob]) -> None:
        """Raise QueueFull if adding `jobs` takes a queue past its max_depth."""
        now = time.monotonic()
        if now - self._read_at >= LOOK_EVERY:
            rows = conn.execute(self.q["queue_depth_limits"]).fetchall()
            self._limits = {str(name): int(depth) for name, depth in rows}
            self._read_at = now
        if not self._limits:
            return
        adding = Counter(j.queue for j in jobs if j.queue in self._limits)
        for queue, n in sorted(adding.items()):
            max_depth = self._limits[queue]
            params = {"queue": queue, "upto": max_depth}
            depth = int(conn.execute(self.q["queue_depth"], params).fetchone()[0])  # type: ignore[index]
            if depth + n > max_depth:
                with self.connect() as own:
                    own.execute(self.q["queue_rejected"], {"queue": queue, "n": n})
                raise QueueFull(queue, depth, max_depth, n)
