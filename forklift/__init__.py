"""forklift: a PostgreSQL-backed durable job queue with a prefork supervisor."""

from __future__ import annotations

from forklift.app import App, JobSpec
from forklift.backoff import Backoff
from forklift.errors import (
    AppImportError,
    ArgumentError,
    ConfigError,
    DatabaseError,
    Fail,
    ForkliftError,
    LeaseLost,
    MigrationError,
    Retry,
    SchemaMissing,
    UnknownTaskError,
)
from forklift.task import Task
from forklift.workers.config import WorkerConfig
from forklift.workers.context import JobContext

__all__ = [
    "App",
    "AppImportError",
    "ArgumentError",
    "Backoff",
    "ConfigError",
    "DatabaseError",
    "Fail",
    "ForkliftError",
    "JobContext",
    "JobSpec",
    "LeaseLost",
    "MigrationError",
    "Retry",
    "SchemaMissing",
    "Task",
    "UnknownTaskError",
    "WorkerConfig",
]
__version__ = "0.1.0"
