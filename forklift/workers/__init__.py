"""The worker: claim → renew → handle, in one process."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forklift.workers.config import WorkerConfig
    from forklift.workers.context import JobContext
    from forklift.workers.worker import Worker

# Imported on first use: `forklift.workers.config` (the CLI's defaults) must not pull in
# the whole worker.
_LAZY = {
    "JobContext": "forklift.workers.context",
    "Worker": "forklift.workers.worker",
    "WorkerConfig": "forklift.workers.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forklift.workers' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["JobContext", "Worker", "WorkerConfig"]
