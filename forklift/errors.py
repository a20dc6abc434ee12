"""The forklift error tree: every error forklift raises is a ForkliftError."""

from __future__ import annotations


class ForkliftError(Exception):
    """A forklift operation failed."""


class ConfigError(ForkliftError, ValueError):
    """forklift is configured wrongly."""


class DsnError(ConfigError):
    """The database URL (DSN) does not parse, or says something no database can be."""


class NoDatabase(ConfigError):
    """No database URL was given: none passed, and neither FORKLIFT_DATABASE_URL nor
    DATABASE_URL is set."""


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
    """No job has that id (never enqueued, or pruned after its retention)."""


class BatchNotFound(ForkliftError, LookupError):
    """No batch has that id (never made, or pruned after its retention)."""


class ResultError(ForkliftError, ValueError):
    """A handler returned a value that cannot be stored as its result (not JSON, or
    larger than App(max_result_bytes=...)): the job ends dead."""


class QueueFull(ForkliftError):
    """The queue holds its max_depth of ready and scheduled jobs (`forklift queues limit
    Q --max-depth N`): nothing was enqueued. `.queue`, `.depth`, `.max_depth`."""

    def __init__(self, queue: str, depth: int, max_depth: int, adding: int) -> None:
        super().__init__(
            f"queue {queue!r} is full: {depth} ready or scheduled, max depth {max_depth}"
            + (f" ({adding} more refused)" if adding > 1 else "")
        )
        self.queue = queue
        self.depth = depth
        self.max_depth = max_depth


class JobFailed(ForkliftError):
    """The job is dead: it failed every attempt (or was given up). `.error` is its last
    error."""

    def __init__(self, job_id: int, error: str | None) -> None:
        super().__init__(f"job {job_id} is dead: {error or 'no error recorded'}")
        self.job_id = job_id
        self.error = error


class JobCancelled(ForkliftError):
    """The job was cancelled before it succeeded."""

    def __init__(self, job_id: int, error: str | None) -> None:
        super().__init__(f"job {job_id} was cancelled ({error or 'no reason recorded'})")
        self.job_id = job_id
        self.error = error


class UnknownTaskError(ForkliftError, LookupError):
    """No task is registered under that name."""


class LeaseLost(ForkliftError):
    """This worker no longer owns the job's lease; its completion was refused."""


class SingletonLost(ForkliftError):
    """This process does not hold the singleton (any longer): its session ended, so
    another holder may be inside the section now; stop the block's work."""


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
