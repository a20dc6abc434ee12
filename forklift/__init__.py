"""forklift: a PostgreSQL-backed durable job queue with a prefork supervisor."""

from __future__ import annotations

from forklift.app import App, JobSpec
from forklift.backoff import Backoff
from forklift.batch import Batch, BatchStatus, BatchWriter
from forklift.errors import (
    AppImportError,
    ArgumentError,
    BatchNotFound,
    ConfigError,
    DatabaseError,
    Fail,
    ForkliftError,
    JobCancelled,
    JobFailed,
    JobNotFound,
    LeaseLost,
    MigrationError,
    QueueFull,
    ResultError,
    Retry,
    SchemaMissing,
    UnknownTaskError,
)
from forklift.limits import Limit
from forklift.task import Task
from forklift.workers.config import WorkerConfig
from forklift.workers.context import AsyncJobContext, JobContext

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
    "Task",
    "UnknownTaskError",
    "WorkerConfig",
]
__version__ = "0.1.0"
