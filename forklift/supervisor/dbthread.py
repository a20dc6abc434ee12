"""The supervisor's one database thread: every statement the parent runs, on one held
connection, fed by the loop through a queue and by the periodic services on their own
schedules.

The loop never waits on the database: what it decides (charge a
dead child's jobs, end a killed child's sessions) it submits here and goes on. Work runs
in the order it was submitted, so a timeout's charge comes before the release of the
killed child's other jobs. A round that raises is logged and outlived.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from forklift._events import emit
from forklift._service import Repeats
from forklift.errors import ForkliftError, SchemaMissing
from forklift.supervisor.refusals import refusal

log = logging.getLogger(__name__)

# A round that found forklift's tables missing this recently says: waiting for migrate.
MISSING_FOR = 3.0
# What reads a range of the jobs table is paced: its rounds take at most this share of
# the thread's time, and a paced service waits at most SLOWEST between two rounds.
PACED = 0.05
SLOWEST = 5.0


@dataclass(frozen=True)
class DbService:
    """A service the database thread runs at once, then every `every` seconds. A paced
    one (`share` < 1) waits longer after a slow round that succeeded, so that its rounds
    take at most that share of the thread's time (up to SLOWEST between rounds): what
    reads a range of the jobs table slows down with it (while another transaction holds
    the horizon, the dead versions it walks pile up) rather than keep the thread and the
    server busy. A failed round is retried after `every` as before."""

    name: str
    every: float
    run_once: Callable[[], object]
    share: float = 1.0

    def next_due(self, began: float, took: float) -> float:
        """When the next round falls due, after a round that succeeded."""
        if self.share >= 1.0:
            return began + self.every
        return began + max(self.every, min(took / self.share, SLOWEST))


class MissingSchema:
    """Whether rounds find forklift's tables missing (before `forklift migrate`), said in
    one line for every service of every thread that shares it, then once every 30 s."""

    def __init__(self) -> None:
        self._repeats = Repeats()
        self._at = float("-inf")  # when a round last found the schema missing

    def found(self, exc: SchemaMissing) -> None:
        self._at = time.monotonic()
        if self._repeats.worth_logging(SchemaMissing("schema missing")):
            emit(log, "supervisor.waiting_for_migrate", logging.WARNING, error=exc)

    def recently(self) -> bool:
        return time.monotonic() - self._at < MISSING_FOR


class DbThread:
    """`submit()` from any thread; `run()` on the thread until `stop()`."""

    def __init__(
        self,
        services: Sequence[DbService] = (),
        cancel: Callable[[], None] | None = None,
        missing: MissingSchema | None = None,
    ) -> None:
        self.services = tuple(services)
        self._cancel = cancel  # cancels the statement running on the thread's connection
        self._cancelled = threading.Event()  # by a stop: its error is no news
        self._work: queue.SimpleQueue[tuple[str, Callable[[], object]] | None] = queue.SimpleQueue()
        self._due = [0.0] * len(self.services)
        self._stopped = threading.Event()
        self._repeats = Repeats()
        self.missing = missing or MissingSchema()  # "run forklift migrate": once for all

    def add(self, services: Sequence[DbService]) -> None:
        """More services, before run()."""
        self.services += tuple(services)
        self._due += [0.0] * len(services)

    def submit(self, name: str, work: Callable[[], object]) -> None:
        self._work.put((name, work))

    def stop(self) -> None:
        """Stop once what was submitted before has run."""
        self._work.put(None)

    def cancel(self) -> None:
        """Cancel the statement running now, if any (a VACUUM that would outlive a stop)."""
        if self._cancel is not None:
            self._cancelled.set()
            self._cancel()

    def run(self) -> None:
        while not self._stopped.is_set():
            self._run_submitted(self._next_wait())
            if self._stopped.is_set():
                return
            now = time.monotonic()
            for i, service in enumerate(self.services):
                if self._stopped.is_set():
                    return
                if now >= self._due[i]:
                    self._due[i] = now + service.every
                    if self._attempt(service.name, service.run_once):
                        self._due[i] = service.next_due(now, time.monotonic() - now)
                    self._run_submitted(0.0)  # the loop's work never waits behind a round

    def _next_wait(self) -> float:
        if not self.services:
            return 1.0
        return max(0.0, min(self._due) - time.monotonic())

    def _run_submitted(self, wait: float) -> None:
        try:
            item = self._work.get(timeout=wait) if wait > 0 else self._work.get_nowait()
        except queue.Empty:
            return
        while True:
            if item is None:  # stop(): everything submitted before it has run
                self._stopped.set()
                return
            self._attempt(*item)
            try:
                item = self._work.get_nowait()
            except queue.Empty:
                return

    def waiting_for_migrate(self) -> bool:
        """Whether a round found forklift's tables missing in the last few seconds."""
        return self.missing.recently()

    def _attempt(self, name: str, work: Callable[[], object]) -> bool:
        """Run `work`; whether it succeeded (a failure is logged)."""
        try:
            work()
        except SchemaMissing as exc:
            # Before `forklift migrate` every service fails so, each on its own table:
            # one line for the whole supervisor, then one every 30 s.
            self.missing.found(exc)
            return False
        except ForkliftError as exc:
            if self._cancelled.is_set():
                return False
            # An outage fails every service the same way underneath: said once for all
            # of them, then every 30 s, not once per service and round. A refusal no
            # retry fixes (authentication, no such database) is an operator's to fix.
            if self._repeats.worth_logging(exc.__cause__ or exc):
                refused = refusal(exc)
                if refused is not None:
                    emit(log, "supervisor.database_refuses", logging.ERROR, error=refused)
                else:
                    emit(log, f"{name}.failed", logging.WARNING, error=exc)
            return False
        except Exception:  # a bug: logged, outlived
            log.exception("%s: round failed; next round as usual", name)
            return False
        return True
