"""The forklift error tree: every error forklift raises is a ForkliftError."""

from __future__ import annotations

import math


class ForkliftError(Exception):
    """A forklift operation failed."""


class ConfigError(ForkliftError, ValueError):
    """forklift is configured wrongly."""


class DsnError(ConfigError):
    """The database URL (DSN) does not parse, or says something no database can be."""


class NoDatabase(ConfigError):
    """No database URL was given: none passed, and neither FORKLIFT_DATABASE_URL nor
    DATABASE_URL is set; `reason` says why no development database stood in for one."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(f"{message}; {reason}" if reason else message)
        self.reason = reason


class AppImportError(ForkliftError):
    """The app named MODULE:APP could not be imported."""


class DatabaseError(ForkliftError):
    """The database refused or could not complete an operation.

    `sqlstate` is the server's error code (None when no server answered: the connection
    failed or was lost, or no pooled connection came), and the psycopg error is kept as
    `__cause__` (`cause`), its class as `cause_class`. `transient` says whether trying
    the same statement again may succeed (the database unavailable: away, busy, or the
    transaction lost a race), as against a refusal it will answer again (bad data, a
    constraint, a privilege, authentication, a statement it does not know), which is
    reported and never retried: see `transient_state` and `forklift._db.transient`.
    """

    def __init__(
        self,
        message: str = "",
        *,
        sqlstate: str | None = None,
        transient: bool = True,
        row_dependent: bool = False,
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        if cause is not None:
            self.__cause__ = cause
        self.sqlstate = sqlstate
        self.transient = transient
        # The error comes from the values a statement was given (a data exception,
        # SQLSTATE class 22, or an integrity violation, 23, the server's or psycopg's
        # own): the same statement over fewer rows may succeed, so a batch is split to
        # find the bad one.
        self.row_dependent = row_dependent

    @property
    def cause_class(self) -> type[BaseException] | None:
        """The class of the error this one was raised from: psycopg's for the server's
        answer (psycopg.errors.CheckViolation, .AdminShutdown, ...) or for no answer
        (psycopg.OperationalError, psycopg_pool.PoolTimeout); None if it has no cause."""
        return None if self.__cause__ is None else type(self.__cause__)


# SQLSTATE classes (the first two characters) and codes after which the same statement
# may succeed when tried again: the connection or the server went away or is busy, or
# the transaction lost a race it may win next time. Anything else the server answers
# is permanent: trying again gets the same answer.
_TRANSIENT_CLASSES = frozenset({"08", "40", "53", "57", "58"})
# Codes of those classes that trying again does not cure: files missing.
_PERMANENT_IN_TRANSIENT_CLASSES = frozenset({"58P01", "58P02"})


def transient_state(sqlstate: str | None) -> bool:
    """Whether an error with this SQLSTATE may pass if the statement is tried again: no
    answer from the server at all (None: the connection failed or was lost), connection
    exceptions (08), insufficient resources (53: too many clients, out of memory, a full
    disk, which its operator may free), operator intervention such as an admin shutdown,
    a query cancelled or timed out, the server starting up (57), system errors (58), and
    a serialization failure or deadlock (40). Data exceptions (22), integrity violations (23),
    authorization (28), syntax and privileges (42) and everything else are permanent."""
    if sqlstate is None:
        return True
    if sqlstate in _PERMANENT_IN_TRANSIENT_CLASSES:
        return False
    return sqlstate[:2] in _TRANSIENT_CLASSES


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


class UniqueConflict(ForkliftError):
    """A live job holds the unique key of the job enqueued with on_conflict="raise":
    nothing was enqueued for it. `.job_id` is the job that holds the key."""

    def __init__(self, job_id: int, task: str) -> None:
        super().__init__(f"job {job_id} holds the unique key of this {task!r} job")
        self.job_id = job_id
        self.task = task

    def __reduce__(self) -> tuple[type[UniqueConflict], tuple[int, str]]:
        return UniqueConflict, (self.job_id, self.task)


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


class Snooze(Exception):
    """Raise (or return) from a handler to run the job again in `seconds`, without
    spending an attempt: the run is given back, its attempt not counted, and counted as a
    snooze instead (`forklift jobs show`). A task allows `max_snoozes` of them; the one past
    that is a failed attempt. The job's effect transaction rolls back; its checkpoint is
    kept."""

    def __init__(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float):
            raise ValueError(f"Snooze seconds must be a number, got {seconds!r}")
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"Snooze seconds must be finite and >= 0, got {seconds!r}")
        super().__init__(f"snoozed for {seconds:g} s")
        self.seconds = float(seconds)

    def __reduce__(self) -> tuple[type[Snooze], tuple[float]]:
        return Snooze, (self.seconds,)  # its one argument is the delay, not the message


class Interrupted(Exception):
    """Raised by `ctx.iterate` at an item boundary once the worker is stopping (or the job
    was cancelled, or its lease lost), after its checkpoint: the job is given back to run
    again from that checkpoint, its attempt not counted. Let it propagate. Raised while
    the worker is not stopping, it is an attempt that failed like any other."""


class LeaseLost(ForkliftError):
    """A checkpoint (and the effect committing with it) was refused: the job is not this
    worker's any more (cancelled, or its lease expired and another claimed it). The
    handler should stop; its outcome will not be recorded."""


class UpstreamFailed(ForkliftError):
    """A workflow step read the result of an upstream step that did not succeed (it ran
    after it with ignore_failure=True): `step`, its `state` ('dead' or 'cancelled') and
    its last `error`."""

    def __init__(self, step: str, state: str, error: str | None) -> None:
        super().__init__(f"upstream step {step!r} is {state}: {error or 'no error recorded'}")
        self.step = step
        self.state = state
        self.error = error


def install_hint(extra: str) -> str:
    """How to add an optional extra (`dashboard`, `embedded`, `otel`), worded the same in
    every message that needs one. forklift is not on PyPI: `pip install 'forklift[x]'`
    would fetch nothing, or somebody else's package, so the hint names where it can come
    from instead."""
    return (
        f"install forklift with the {extra} extra: pip install -e '.[{extra}]' in a clone "
        f"of forklift, or add [{extra}] to what you installed forklift from (a wheel's "
        "path, a git URL)"
    )
