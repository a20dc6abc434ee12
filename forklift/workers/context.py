"""JobContext: what a handler knows about its job, and the transaction its effect joins."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from forklift.store import ClaimedJob

_EVENT_LOCK = threading.Lock()


class JobContext:
    """Passed to every handler as its first argument.

    `cancelled` is set when the worker lost the job's lease or is stopping past its grace:
    a long handler may poll it to stop early. `transaction()` yields a connection in an
    open transaction that stays open until the handler returns; the job's completion
    commits in that same transaction, so the effect commits exactly when the job does.
    """

    def __init__(self, job: ClaimedJob, pool: ConnectionPool[psycopg.Connection[Any]]) -> None:
        self.job = job
        self._cancelled: threading.Event | None = None
        self.lease_lost = False
        self.slot_freed = False
        # Set once the outcome is written (or refused); guarded by outcome_lock so the
        # heartbeat never calls a job lost that just completed.
        self.finished = False
        self.outcome_lock = threading.Lock()
        self.duration = 0.0
        self._pool = pool
        self._conn: psycopg.Connection[Any] | None = None
        self._tx: ExitStack | None = None

    @property
    def cancelled(self) -> threading.Event:
        """Set when the job should stop early: lease lost, or stopping past grace."""
        # Made on first use: most handlers never look, and an Event per job costs.
        if self._cancelled is None:
            with _EVENT_LOCK:
                if self._cancelled is None:
                    self._cancelled = threading.Event()
        return self._cancelled

    @property
    def job_id(self) -> int:
        return self.job.id

    @property
    def attempt(self) -> int:
        return self.job.attempt

    @property
    def max_attempts(self) -> int:
        return self.job.max_attempts

    @property
    def args(self) -> dict[str, Any]:
        return self.job.args

    @property
    def idempotency_key(self) -> str | None:
        return self.job.idempotency_key

    @property
    def task(self) -> str:
        return self.job.task

    @property
    def queue(self) -> str:
        return self.job.queue

    @contextmanager
    def transaction(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection inside the job's effect transaction (a savepoint when nested).

        Leaving the block does not commit: the worker commits after the handler returns,
        together with the job's completion. If the block or the handler raises, the
        effect rolls back and the job fails like any other.
        """
        if self._conn is None:
            self._conn = self._pool.getconn()
            self._tx = ExitStack()
            self._tx.enter_context(self._conn.transaction())
            yield self._conn
            return
        with self._conn.transaction():
            yield self._conn

    @property
    def in_transaction(self) -> bool:
        return self._conn is not None

    @property
    def connection(self) -> psycopg.Connection[Any] | None:
        return self._conn

    def end_transaction(self, commit: bool) -> None:
        """Commit or roll back the effect transaction and return its connection."""
        conn, tx = self._conn, self._tx
        self._conn = self._tx = None
        if conn is None or tx is None:
            return
        try:
            if commit:
                tx.close()
            else:
                tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
        finally:
            self._pool.putconn(conn)
