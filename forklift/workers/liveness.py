"""The worker's liveness lock: a session-level advisory lock named by its lease owner id,
held on a connection of its own for as long as the process lives.

PostgreSQL releases it the moment that session ends (the process died, its host
vanished and keepalives gave up, the session was terminated), so another replica can
tell a vanished owner from a slow one within a second (VanishedOwners, supervisor/deaths.py) instead
of waiting for the registry prune or the leases. The keeper looks at its connection
every `tick` (a poll of the socket: an ended session has its FATAL message or EOF
waiting there) and asks the server every `ping_every` whether it still holds the lock;
a lock lost is taken again as soon as the database answers, and the claim loop claims
nothing while it is not held (`wait_held`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

import psycopg

from forklift import _db, _locks
from forklift._db import looks_alive
from forklift._events import emit

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LivenessConfig:
    tick: float = 0.2  # a lost lock is taken back within this of the database answering
    ping_every: float = 2.0


class LivenessLock:
    """Holds the liveness lock of `owner`; `run()` on a thread of its own until stop()."""

    def __init__(
        self,
        dsn: str,
        timeouts: _db.Timeouts,
        schema: str,
        owner: str,
        application_name: str,
        config: LivenessConfig | None = None,
    ) -> None:
        self.dsn = dsn
        self.timeouts = timeouts
        self.name = _locks.liveness(schema, owner)
        self.application_name = application_name
        self.config = config or LivenessConfig()
        self.held = threading.Event()
        self._stopped = threading.Event()
        self._conn: psycopg.Connection[Any] | None = None
        self._since_ping = 0.0
        self._failing = False  # a retake failed since the last loss: say so once

    def wait_held(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the lock to be held; whether it is."""
        return self.held.wait(timeout)

    def run(self) -> None:
        while not self._stopped.is_set():
            self.run_once()
            self._stopped.wait(self.config.tick)
        self._drop()

    def stop(self) -> None:
        """Let go of the lock (the connection closes) once run() sees this."""
        self._stopped.set()

    def run_once(self) -> bool:
        """Check the connection, (re)take the lock if it was lost; whether it is held."""
        self._since_ping += self.config.tick
        try:
            if self._conn is not None and not self._still_held():
                self._drop()
                emit(log, "worker.liveness_lost", logging.WARNING, lock=self.name)
            if self._conn is None:
                self._take()
        except psycopg.Error as exc:
            self._drop()
            if not self._failing:  # once per outage, not every tick of it
                self._failing = True
                emit(log, "worker.liveness_failed", logging.WARNING, error=exc)
        return self.held.is_set()

    def _still_held(self) -> bool:
        assert self._conn is not None
        if not looks_alive(self._conn):
            return False
        if self._since_ping < self.config.ping_every:
            return True
        self._since_ping = 0.0
        return _locks.held(self._conn, self.name)

    def _take(self) -> None:
        conn = _db.connect(self.dsn, self.timeouts, application_name=self.application_name)
        if not _locks.try_take(conn, self.name):  # only a process with our owner id could
            conn.close()
            raise psycopg.OperationalError(f"liveness lock {self.name} is held by another")
        self._conn = conn
        self._since_ping = 0.0
        self.held.set()
        if self._failing:
            self._failing = False
            emit(log, "worker.liveness_taken", lock=self.name)

    def _drop(self) -> None:
        self.held.clear()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass
