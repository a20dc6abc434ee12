"""The supervisor's one session-level connection: the liveness lock that vouches for it and
all its children, LISTEN for ready jobs and operators' orders (handed to the children: an
order as a line on the child's hint pipe, a new job as a byte on its claim loop's
self-pipe), and the lock that makes this replica the one that maintains.

One connection for what needs a session, whatever the number of children: a child holds
only the connection its claims, renewals and completions share (`--workers N` holds at
most N + 2 connections while handlers do not use ctx.transaction()).
The thread owns the connection; nothing else touches it. The loop only ever adds and
removes children's pipes on the `HintFanout`, under a lock no I/O waits under (a write
to a pipe is non-blocking; a full pipe drops the hint, as a missed NOTIFY would be).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psycopg

from forklift import _db, _locks, _sql
from forklift._events import emit
from forklift.shared_vouch import SharedVouch
from forklift.workers.wakeup import NEWS

log = logging.getLogger(__name__)

# A hint line: one kind letter, then the payload. `q`: a queue got a job; `c`: an order.
QUEUE, ORDER = "q", "c"


class HintFanout:
    """The write ends of each child's two pipes: its hint pipe, on which `send` writes an
    order as a line for the child's listener thread, and its claim loop's self-pipe
    (workers/wakeup.py), on which a queue's new job is one NEWS byte. The news goes
    straight to the loop that claims: through the listener thread (a thread switch, the
    GIL handed over twice) the claim began 0.18 ms after the notification reached this
    thread, of a job's ~1.6 ms from enqueue to start at 200 jobs/s; this way, 0.13 ms."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wakes: dict[int, int] = {}  # a child's hint pipe -> its self-pipe

    def add(self, hint_fd: int, wake_fd: int) -> None:
        os.set_blocking(hint_fd, False)
        os.set_blocking(wake_fd, False)
        with self._lock:
            self._wakes[hint_fd] = wake_fd

    def remove(self, hint_fd: int) -> None:
        """Forget a child's pipes and close them (under the lock: no write can race it)."""
        with self._lock:
            wake_fd = self._wakes.pop(hint_fd, None)
            if wake_fd is not None:
                os.close(hint_fd)
                os.close(wake_fd)

    def send(self, kind: str, payload: str) -> None:
        if kind == QUEUE:  # only our queues are forwarded: wake the claim loops
            data = NEWS
        else:
            data = f"{kind}{payload}\n".encode()
            if len(data) > 4096:  # atomic only up to PIPE_BUF: a hint that long is no hint
                return
        with self._lock:
            for fd in self._wakes.values() if kind == QUEUE else self._wakes:
                try:
                    os.write(fd, data)
                except OSError:  # full (the child is awake or busy: it polls) or gone
                    pass


@dataclass(frozen=True)
class SessionConfig:
    # A lost session is retried every tick, never backing off: the liveness lock must be
    # back within a tick of the database answering, long before a peer's second sighting
    # (a second apart) would take this supervisor's workers for dead. A refused connection
    # costs next to nothing; a stalled one is bounded by the connect timeout.
    tick: float = 0.2
    ping_every: float = 2.0  # a round trip that proves the lock is still held
    maintenance_every: float = 5.0  # how often a replica not maintaining tries the lock


class SupervisorSession:
    """Runs on a thread of its own until `stop()`; reconnects with a short backoff."""

    def __init__(
        self,
        dsn: str,
        timeouts: _db.Timeouts,
        schema: str,
        queues: Sequence[str],
        fanout: HintFanout,
        config: SessionConfig | None = None,
        vouch: SharedVouch | None = None,
    ) -> None:
        self.dsn = dsn
        self.timeouts = timeouts
        self.schema = schema
        self.queues = frozenset(queues)
        self.fanout = fanout
        self.config = config or SessionConfig()
        self.supervisor_id = ""  # set before start()
        # Whether the liveness lock is held, told to the children (mapped here, before
        # any fork): each tick that finds the session alive confirms it; they claim only
        # while it is fresh.
        self.vouch = vouch or SharedVouch()
        self.maintaining = threading.Event()  # the maintenance lock is held
        self._lost_to: str | None = None  # why the session is down: said once an outage
        self._q = _sql.load("forklift.store", "queries.sql", schema)
        self._control = _sql.control_channel_name(schema)
        self._stopped = threading.Event()

    @property
    def liveness_lock(self) -> str:
        return _locks.liveness(self.schema, self.supervisor_id)

    @property
    def maintenance_lock(self) -> str:
        return f"maintenance:{self.schema}"

    def stop(self) -> None:
        self._stopped.set()

    def run(self) -> None:
        assert self.supervisor_id, "the session's liveness lock is named by the supervisor"
        while not self._stopped.is_set():
            try:
                with _db.connect(
                    self.dsn, self.timeouts, application_name="forklift-supervisor"
                ) as conn:
                    self._hold(conn)
            except psycopg.Error as exc:
                self._lost(exc)
            finally:
                self.vouch.withdraw()
                self.maintaining.clear()

    def _hold(self, conn: psycopg.Connection[Any]) -> None:
        if not _locks.try_take(conn, self.liveness_lock):
            raise psycopg.OperationalError(f"liveness lock {self.liveness_lock} is held by another")
        conn.execute(self._q["control_listen"])
        conn.execute(self._q["channel_listen"])
        self.vouch.confirm()
        if self._lost_to is not None:
            emit(log, "supervisor.session_back")
        self._lost_to = None
        self.fanout.send(QUEUE, "")  # whatever came while we were away: look now
        next_ping = next_try = time.monotonic()
        while not self._stopped.is_set():
            for note in conn.notifies(timeout=self.config.tick):
                self._forward(note.channel, note.payload)
            if not self._only_notified(conn):
                raise psycopg.OperationalError("the supervisor's session ended")
            self.vouch.confirm()  # the session lives, and with it the lock
            now = time.monotonic()
            if now >= next_ping:
                next_ping = now + self.config.ping_every
                if not _locks.held(conn, self.liveness_lock):
                    raise psycopg.OperationalError("the liveness lock was lost")
            if not self.maintaining.is_set() and now >= next_try:
                next_try = now + self.config.maintenance_every
                if _locks.try_take(conn, self.maintenance_lock):
                    self.maintaining.set()

    def _only_notified(self, conn: psycopg.Connection[Any]) -> bool:
        """Whether the idle session's unread input, if any, was notifications (read and
        forwarded here), not its end (EOF: reading raises). A NOTIFY that came after
        notifies() returned is input too: taken for the session's end, it dropped the
        liveness lock and stalled every hint for a tick (every few seconds at 200
        jobs/s)."""
        if _db.looks_alive(conn):
            return True
        pgconn = conn.pgconn
        try:
            pgconn.consume_input()
        except psycopg.OperationalError:
            return False  # the session ended
        encoding = conn.info.encoding
        while (note := pgconn.notifies()) is not None:
            self._forward(note.relname.decode(encoding), note.extra.decode(encoding))
        return not conn.broken and pgconn.status == psycopg.pq.ConnStatus.OK

    def _forward(self, channel: str, payload: str) -> None:
        if channel == self._control:
            self.fanout.send(ORDER, payload)  # a hint: the child checks the database
        elif payload in self.queues:
            self.fanout.send(QUEUE, payload)

    def _lost(self, exc: psycopg.Error) -> None:
        cause = " ".join(str(exc).split()) or type(exc).__name__
        if self._lost_to is None:  # once per outage
            emit(log, "supervisor.session_lost", logging.WARNING, error=_db.redact(cause))
        self._lost_to = _db.redact(cause)
        self._stopped.wait(self.config.tick)
