"""The forklift error tree: every error forklift raises is a ForkliftError."""

from __future__ import annotations


class ForkliftError(Exception):
    """A forklift operation failed."""


class ConfigError(ForkliftError, ValueError):
    """forklift is configured wrongly."""


class DsnError(ConfigError):
    """The database URL (DSN) does not parse, or says something no database can be."""


class AppImportError(ForkliftError):
    """The app named MODULE:APP could not be imported."""


class DatabaseError(ForkliftError):
    """The database refused or could not complete an operation."""


class SchemaMissing(DatabaseError):
    """forklift's tables are not in this database (yet): run `forklift migrate`."""


class MigrationError(ForkliftError):
    """The schema cannot be migrated safely."""


class ArgumentError(ForkliftError, ValueError):
    """Job arguments cannot be stored as JSON in PostgreSQL."""


class JobNotFound(ForkliftError, LookupError):
    """No job has that id."""


class UnknownTaskError(ForkliftError, LookupError):
    """No task is registered under that name."""


class LeaseLost(ForkliftError):
    """This worker no longer owns the job's lease; its completion was refused."""


class Retry(Exception):
    """Raise from a handler to retry the job after `delay` seconds (None: the task's backoff).

    It still counts as an attempt; the job goes dead when attempts run out.
    """

    def __init__(self, reason: str = "retry requested", *, delay: float | None = None) -> None:
        super().__init__(reason)
        if delay is not None and delay < 0:
            raise ValueError("Retry delay must be >= 0 seconds")
        self.delay = delay


class Fail(Exception):
    """Raise from a handler to mark the job dead at once, without further attempts."""
