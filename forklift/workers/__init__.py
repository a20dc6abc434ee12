"""The worker: claim → renew → handle, in one process."""

from __future__ import annotations

from forklift.workers.config import WorkerConfig
from forklift.workers.context import JobContext
from forklift.workers.worker import Worker

__all__ = ["JobContext", "Worker", "WorkerConfig"]
