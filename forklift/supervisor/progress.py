"""A progress line while work flows: `supervisor.progress done=… rate=…/s failed=… backlog=…`.

At INFO a supervisor otherwise says nothing between `worker.started` and its stop, however
many jobs run (successes log at DEBUG). This service, run on the database thread (dbthread.py),
logs one line every `every` seconds while jobs finish or wait, and keeps quiet when
nothing moves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from forklift._events import emit
from forklift.admin import AdminStore
from forklift.errors import DatabaseError
from forklift.metrics import Totals

log = logging.getLogger(__name__)

FAILED = ("failed", "crashed", "lease_lost")


@dataclass(frozen=True)
class Progress:
    done: int  # succeeded, since the supervisor started
    failed: int  # attempts that failed (and will retry, or went dead)
    dead: int
    rate: float  # jobs done per second since the last line
    backlog: int | None  # due jobs waiting in the queues served (None: not read)


class ProgressReporter:
    def __init__(
        self,
        totals: Totals,
        admin: AdminStore,
        queues: Sequence[str],
        every: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.totals = totals
        self.admin = admin
        self.queues = set(queues)
        self.every = every
        self.clock = clock
        self._last_at = clock()
        self._last: Progress | None = None

    def run_once(self) -> Progress | None:
        """Log a progress line if `every` has passed and anything moved; return it."""
        now = self.clock()
        if now - self._last_at < self.every:
            return None
        done, failed, dead = self._counts()
        before = self._last or Progress(0, 0, 0, 0.0, 0)
        backlog = self._backlog()
        progress = Progress(
            done, failed, dead, (done - before.done) / (now - self._last_at), backlog
        )
        self._last_at, self._last = now, progress
        if (done, failed, dead) == (before.done, before.failed, before.dead) and not backlog:
            return None  # idle: nothing to say
        emit(
            log,
            "supervisor.progress",
            done=done,
            rate=f"{progress.rate:.1f}/s",
            failed=failed,
            dead=dead,
            backlog="?" if backlog is None else backlog,
        )
        return progress

    def _counts(self) -> tuple[int, int, int]:
        with self.totals.lock:
            jobs = dict(self.totals.jobs)
        by_outcome: dict[str, int] = {}
        for (_queue, _task, outcome), n in jobs.items():
            by_outcome[outcome] = by_outcome.get(outcome, 0) + n
        failed = sum(by_outcome.get(o, 0) for o in FAILED) + by_outcome.get("dead", 0)
        return by_outcome.get("succeeded", 0), failed, by_outcome.get("dead", 0)

    def _backlog(self) -> int | None:
        try:
            stats = self.admin.queue_stats(throughput=False)
        except DatabaseError:
            return None
        return sum(s.ready for s in stats if s.queue in self.queues)
