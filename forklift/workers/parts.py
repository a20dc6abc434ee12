"""What the worker's background services share: its state and the hooks they call."""

from __future__ import annotations

import logging
import threading

from forklift import _db
from forklift.app import App
from forklift.metrics import Tally
from forklift.store import JobStore
from forklift.workers.config import WorkerConfig
from forklift.workers.context import JobContext
from forklift.workers.wakeup import Wakeup


class WorkerParts:
    """Declarations only: Worker sets these in _boot() and defines the hooks."""

    app: App
    config: WorkerConfig
    owner: str
    store: JobStore
    tally: Tally | None
    _timeouts: _db.Timeouts
    _closing: threading.Event
    _flush_lock: threading.Lock
    _wakeup: Wakeup | None

    def _job_event(
        self, event: str, ctx: JobContext, level: int = logging.INFO, **fields: object
    ) -> None:
        raise NotImplementedError

    def _held_snapshot(self) -> list[JobContext]:
        raise NotImplementedError

    def _succeeded(self, ctx: JobContext) -> None:
        raise NotImplementedError

    def _lease_lost(self, ctx: JobContext, effect: str) -> None:
        raise NotImplementedError
