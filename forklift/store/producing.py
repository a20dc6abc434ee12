"""What an enqueue takes from the limits table: limit keys, and backpressure.

A job of a limited task is stored with its limit's key (jobs.limit_key; '' for a limit
with no key), which puts it in the claim indexes of limited jobs (migration 0007), even
from a producer that does not declare the task (it enqueues by name): the key is the
argument's value, as the worker's declaration would have made it. A callable key needs
the task declared; without it, such jobs share one key. A job enqueued before its
producer knew the limit is keyed by the first claim under limits that walks past it.

An enqueue into a queue holding its max_depth of ready and scheduled jobs (`forklift
queues limit Q --max-depth N`) raises QueueFull at once and inserts nothing; the refusal
is counted (limits.rejected) from the process's aside thread (_steps.Asides), so however
many producers are refused together, none waits for a connection or a row lock.

Both are read from the limits table at most once a second per process, so a new limit
is obeyed within a second and a queue or task without one costs an enqueue a dict
lookup. The depth is counted (up to max_depth, index-only scans of the ready indexes) in the
enqueuing transaction's snapshot: producers enqueueing into the same queue at the same
moment do not see each other, so the queue may overshoot by what they add together.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Sequence

from forklift import _sql
from forklift.errors import QueueFull
from forklift.limits import key_from_args
from forklift.store._rows import NewJob
from forklift.store._steps import Aside, Query, Steps

LOOK_EVERY = 1.0  # seconds a process trusts its list of queues with a max_depth


class ProducerLimits:
    def __init__(self, schema: str) -> None:
        self.q = _sql.load("forklift.store", "limits.sql", schema)
        self._limits: dict[str, int] = {}  # queue: max_depth
        # Each limited task: the argument its limit is keyed by (None: no key, or one a
        # callable computes, which only a producer declaring the task can)
        self._key_args: dict[str, str | None] = {}
        self._read_at = -LOOK_EVERY

    def prepare(self, jobs: Sequence[NewJob]) -> Steps[None]:
        """Give `jobs` their limit keys; raise QueueFull if adding them takes a queue
        past its max_depth (the refusal is counted apart, soon after: the caller's
        transaction rolls back, and the caller never waits for the count)."""
        yield from self.refresh()
        for job in jobs:
            self.key(job)
        yield from self.check_depth(jobs)

    def refresh(self) -> Steps[None]:
        """Read the limits table again if this process's copy is a second old."""
        now = time.monotonic()
        if now - self._read_at < LOOK_EVERY:
            return
        limits: dict[str, int] = {}
        key_args: dict[str, str | None] = {}
        for scope, name, max_depth, key_arg in (yield Query(self.q["producer_limits"])):
            if scope == "queue":
                limits[name] = int(max_depth)
            else:
                key_args[name] = None if key_arg is None else str(key_arg)
        self._limits, self._key_args, self._read_at = limits, key_args, now

    @property
    def depth_limited(self) -> bool:
        """Whether some queue has a max_depth (as last read): every job of an enqueue
        must then be counted before any of them is inserted."""
        return bool(self._limits)

    def key(self, job: NewJob) -> None:
        """Give `job` its task limit's key, if its task has a limit (as last read)."""
        if job.limit_key is None and job.task in self._key_args:
            job.limit_key = key_from_args(job.args, self._key_args[job.task])

    def check_depth(self, jobs: Sequence[NewJob]) -> Steps[None]:
        """Raise QueueFull (inserting nothing) if `jobs` take a queue past its max_depth."""
        if not self._limits:
            return
        adding = Counter(j.queue for j in jobs if j.queue in self._limits)
        for queue, n in sorted(adding.items()):
            max_depth = self._limits[queue]
            params = {"queue": queue, "upto": max_depth}
            depth = int((yield Query(self.q["queue_depth"], params))[0][0])
            if depth + n > max_depth:
                yield Aside(self.q["queue_rejected"], {"queue": queue, "n": n})
                raise QueueFull(queue, depth, max_depth, n)
