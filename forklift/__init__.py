"""forklift: a PostgreSQL-backed durable job queue with a prefork supervisor."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from forklift._version import __version__ as __version__
from forklift.errors import (
    AppImportError,
    ArgumentError,
    BatchNotFound,
    ConfigError,
    DatabaseError,
    Fail,
    ForkliftError,
    Interrupted,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    MigrationError,
    QueueFull,
    ResultError,
    Retry,
    SchemaMissing,
    SingletonLost,
    Snooze,
    UniqueConflict,
    UnknownTaskError,
    UpstreamFailed,
)

if TYPE_CHECKING:
    from forklift.app import App, JobSpec
    from forklift.backoff import Backoff
    from forklift.batch import Batch, BatchStatus, BatchWriter
    from forklift.limits import Limit
    from forklift.task import Task, TaskOptions
    from forklift.unique import Unique
    from forklift.workers.config import WorkerConfig
    from forklift.workers.context import AsyncJobContext, JobContext
    from forklift.workflow import Step, Workflow

# Imported on first use (PEP 562): `forklift --help`, and every command that needs no
# database driver, start without psycopg and the rest behind App.
_LAZY = {
    "App": "forklift.app",
    "JobSpec": "forklift.app",
    "Backoff": "forklift.backoff",
    "Batch": "forklift.batch",
    "BatchStatus": "forklift.batch",
    "BatchWriter": "forklift.batch",
    "Limit": "forklift.limits",
    "Task": "forklift.task",
    "TaskOptions": "forklift.task",
    "Unique": "forklift.unique",
    "WorkerConfig": "forklift.workers.config",
    "JobContext": "forklift.workers.context",
    "AsyncJobContext": "forklift.workers.context",
    "Step": "forklift.workflow",
    "Workflow": "forklift.workflow",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forklift' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without coming here
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "App",
    "AppImportError",
    "ArgumentError",
    "AsyncJobContext",
    "Backoff",
    "Batch",
    "BatchNotFound",
    "BatchStatus",
    "BatchWriter",
    "ConfigError",
    "DatabaseError",
    "Fail",
    "ForkliftError",
    "Interrupted",
    "JobCancelled",
    "JobContext",
    "JobFailed",
    "JobNotFound",
    "JobSpec",
    "LeaseLost",
    "Limit",
    "MigrationError",
    "QueueFull",
    "ResultError",
    "Retry",
    "SchemaMissing",
    "SingletonLost",
    "Snooze",
    "Step",
    "Task",
    "TaskOptions",
    "Unique",
    "UniqueConflict",
    "UnknownTaskError",
    "UpstreamFailed",
    "WorkerConfig",
    "Workflow",
]
