"""Maintenance: rescue exhausted expired leases, prune old jobs (and batches), vacuum
the jobs table and sweep for finished batches, one replica at a time, on a thread of
its own (the supervisor's maintenance thread, or a worker's)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import NamedTuple

import psycopg

from forklift import _db
from forklift._events import emit
from forklift._service import TestSignal, run_every
from forklift._singleton import singleton
from forklift.errors import DatabaseError
from forklift.store import (
    Conn,
    JobStore,
    jobs_owned,
    jobs_vacuum,
    jobs_vacuum_due,
    short_connection,
)
from forklift.workers.batch_ends import BatchSweep

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class MaintenanceConfig:
    """How often maintenance runs, how long finished jobs are kept, and how it prunes."""

    interval: float = 10.0
    keep_finished: float = 86400.0  # succeeded and cancelled jobs
    keep_dead: float = 7 * 86400.0
    # Jobs deleted per statement: row locks on ten thousand rows for ~0.1 s, never a long
    # one. (2,000 every 0.5 s kept up with ~1,800 finished jobs/s: at 5,000/s the table
    # grew by 190,000 live rows a minute.)
    prune_batch: int = 10000
    # After a full batch (pruning is behind) the next round comes this soon, not after
    # `interval`: a queue finishing thousands of jobs a second is pruned as fast.
    catch_up: float = 0.05


class Maintained(NamedTuple):
    """What one round did: jobs rescued to dead, finished jobs pruned, whether the jobs
    table was vacuumed."""

    rescued: int
    pruned: int
    vacuumed: bool = False


class Maintenance:
    """Dead-letters expired leases with no attempts left, prunes finished jobs past
    their retention, and vacuums the jobs table when its dead tuples pile up. A
    singleton section: across every replica one worker at a time.

    The vacuum does not wait for autovacuum: a server may run without it, and even with
    it a table that churns thousands of rows a second gathers a minute of dead tuples
    between two autovacuum naps. VACUUM (SKIP_LOCKED) never waits for a lock; a role
    that does not own the table cannot vacuum it and leaves it to autovacuum (said once).
    While another transaction holds the horizon, the table is vacuumed once: until the
    horizon moves, another VACUUM would remove nothing.
    """

    def __init__(
        self,
        store: JobStore,
        dsn: str,
        timeouts: _db.Timeouts,
        config: MaintenanceConfig | None = None,
        section: Callable[[], AbstractContextManager[object]] | None = None,
        sweep: BatchSweep | None = None,
        vacuum_on: Callable[[], AbstractContextManager[Conn]] | None = None,
    ) -> None:
        self.store = store
        # Finishes batches whose end nobody followed up: each round, and every second
        # in between when the caller polls (run_due).
        self.sweep = sweep
        self.dsn = dsn
        self.timeouts = timeouts
        self.config = config or MaintenanceConfig()
        # Whether this replica maintains now: by default a singleton section of its own
        # (a dedicated connection per round); a supervisor passes its session's lock.
        self._mine = section or (lambda: singleton(self.dsn, self.timeouts, self._section))
        # Where VACUUM runs: in no transaction (behind a transaction-mode pooler every
        # statement of the store's connections runs in one, to carry its bounds) and
        # not on a worker's own connection, which its claims share: by default a short
        # connection of its own to the session URL (direct, or a session-mode pooler's).
        self._vacuum_on = vacuum_on or (
            lambda: short_connection(
                _db.session_dsn(self.dsn), self.timeouts, "forklift-maintenance",
                "vacuuming the jobs table failed",
            )
        )  # fmt: skip
        self.ran: TestSignal[Maintained | None] = TestSignal()
        self._section = f"maintenance:{store.schema}"
        self._next = time.monotonic()
        self._next_vacuum = time.monotonic()
        self._may_vacuum: bool | None = None  # not known until the first round asks
        self._vacuumed_below: int | None = None  # the horizon of the last VACUUM

    def run(self, closing: threading.Event) -> None:
        """Run rounds as they fall due until `closing` is set; a failure is logged."""

        def until_due() -> float:
            return max(0.0, self._next - time.monotonic())

        def round_() -> None:
            self._next = time.monotonic() + self.config.interval  # also after a failure
            self.run_once()

        run_every(until_due, round_, closing, log, "maintenance.failed")

    def run_due(self) -> Maintained | None:
        """A round if one is due (for a caller that polls, as the supervisor's database
        thread does); None otherwise."""
        now = time.monotonic()
        if now < self._next:
            if self.sweep is not None and self.sweep.due(now):
                with self._mine() as mine:
                    if mine:
                        self.sweep.run_once()
            return None
        self._next = now + self.config.interval  # also after a failure
        result = self.run_once()
        if result is None:  # another replica's turn, or not ours yet: ask again soon
            self._next = now + min(1.0, self.config.interval)
        return result

    def run_once(self) -> Maintained | None:
        """One round, or None when another replica holds the section."""
        cfg = self.config
        with self._mine() as mine:
            if not mine:
                self.ran.emit(None)
                return None
            rescued = self.store.job_rescue_exhausted()
            pruned = self.store.job_prune(cfg.keep_finished, cfg.keep_dead, cfg.prune_batch)
            if self.sweep is not None:
                self.sweep.run_once()
                self.sweep.batches.prune(cfg.keep_finished, cfg.prune_batch)
                self.sweep.workflows.prune(cfg.keep_finished, cfg.prune_batch)
            vacuumed = self._vacuum_if_due()
        if pruned >= cfg.prune_batch:
            self._next = time.monotonic() + cfg.catch_up
        for job_id in rescued:
            emit(
                log, "job.dead", logging.ERROR, job=job_id, error="lease expired, no attempts left"
            )
        result = Maintained(len(rescued), pruned, vacuumed)
        self.ran.emit(result)
        return result

    def _vacuum_if_due(self) -> bool:
        """VACUUM the jobs table if its dead tuples passed the threshold, at most once
        an interval; whether it did."""
        now = time.monotonic()
        if now < self._next_vacuum:
            return False
        self._next_vacuum = now + self.config.interval
        if self._may_vacuum is None:
            self._may_vacuum = jobs_owned(self.store)
            if not self._may_vacuum:
                emit(log, "maintenance.no_vacuum", reason="not the owner of the jobs table")
        if not self._may_vacuum:
            return False
        due = jobs_vacuum_due(self.store)
        if not due.due or due.horizon == self._vacuumed_below:
            # Under a held horizon the dead tuples stay, and stay due: a VACUUM now
            # would scan the whole table again and remove nothing the last one left.
            return False
        began = time.monotonic()
        try:
            with self._vacuum_on() as conn:
                jobs_vacuum(self.store, conn)
        except DatabaseError as exc:
            if not isinstance(exc.__cause__, psycopg.errors.ActiveSqlTransaction):
                raise
            self._may_vacuum = False  # said once: every VACUUM would fail so
            emit(
                log, "maintenance.no_vacuum", logging.WARNING,
                reason="VACUUM cannot run in a transaction block: the session URL "
                f"({_db.SESSION_URL_ENV}) leads through a transaction-mode pooler; "
                "autovacuum keeps the jobs table",
            )  # fmt: skip
            return False
        self._vacuumed_below = due.horizon
        emit(log, "maintenance.vacuumed", logging.DEBUG, took=round(time.monotonic() - began, 3))
        return True
