"""`forklift worker`: one worker process in the foreground, without a supervisor, yet
titled and registered like a supervisor's child, so `ps` and `forklift ps` show it.

It registers itself (kind worker, no supervisor) every few seconds from a thread, and
deregisters when it stops; if it vanishes, other replicas prune its row and charge its
jobs as they would a supervisor's worker.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

from forklift import _db
from forklift._events import emit
from forklift._ids import make_owner
from forklift._service import run_every
from forklift.app import App
from forklift.errors import DatabaseError, ForkliftError
from forklift.store import ClaimedJob
from forklift.supervisor.rss import rss_of
from forklift.supervisor.store import ProcessInfo, SupervisorStore
from forklift.supervisor.title import ChildTitle
from forklift.workers.config import WorkerConfig
from forklift.workers.worker import Worker

log = logging.getLogger(__name__)

REGISTER_EVERY = 5.0


class StandaloneWorker:
    """A Worker with a process title, a registry row, and signal handling."""

    def __init__(self, app: App, config: WorkerConfig) -> None:
        self.owner = make_owner()
        self.title = ChildTitle.standalone(config.queues)
        self.current: dict[int, str] = {}
        self.worker = Worker(
            app, config, owner=self.owner, on_job_start=self._started, on_job_end=self._ended
        )
        timeouts = _db.Timeouts.for_lease(config.lease)
        self.store = SupervisorStore(app.dsn, app.schema, timeouts)
        self.queues = ",".join(config.queues)
        self.labels = config.labels
        self.begun = time.monotonic()
        self._stopped = threading.Event()

    def run(self) -> int:
        try:
            _db.needs_session_url(self.worker.app.dsn, self.store.timeouts, "forklift worker")
        except DatabaseError as exc:  # not answering yet: the worker waits for it
            emit(log, "worker.pooler_unknown", logging.WARNING, error=exc)
        self._handle_signals()
        self.title.update()
        beat = threading.Thread(target=self._register_loop, name="forklift-registry", daemon=True)
        beat.start()
        try:
            self.worker.run()
        finally:
            self._stopped.set()
            beat.join(timeout=10)
            try:
                self.store.process_forget(self.owner, [])
            except ForkliftError as exc:  # stopping anyway; the row is pruned when stale
                emit(log, "registry.deregister_failed", logging.WARNING, error=exc)
        return 0

    def register_once(self) -> None:
        current = next(iter(self.current), None)
        row = ProcessInfo(
            self.owner, "worker", socket.gethostname(), os.getpid(), None, self.queues,
            current, rss_of() or None, time.monotonic() - self.begun, ",".join(self.labels),
        )  # fmt: skip
        self.store.process_upsert_many([row])

    def _register_loop(self) -> None:
        try:
            self.register_once()  # at once: ps shows it from its start
        except ForkliftError as exc:
            emit(log, "registry.heartbeat_failed", logging.WARNING, error=exc)
        run_every(
            REGISTER_EVERY, self.register_once, self._stopped, log, "registry.heartbeat_failed"
        )

    def _started(self, job: ClaimedJob) -> None:
        self.current[job.id] = job.task
        self.title.started(job.id, job.task)

    def _ended(self, job: ClaimedJob, outcome: str) -> None:
        self.current.pop(job.id, None)
        self.title.ended(job.id)

    def _handle_signals(self) -> None:
        def on_signal(signum: int, frame: FrameType | None) -> None:
            # Only flag and wake: the loop does the work (a second INT or any QUIT: fast).
            fast = signum == signal.SIGQUIT or (signum == signal.SIGINT and self.worker.stopping)
            self.worker.request_stop(fast=fast)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT):
            signal.signal(sig, on_signal)
