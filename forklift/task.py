"""Task: a registered handler, its defaults, and the check that arguments fit it."""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    ParamSpec,
    Protocol,
    TypedDict,
    TypeVar,
    Unpack,
)

import psycopg

from forklift import _names
from forklift._job import JobOptions, check_priority
from forklift.backoff import Backoff
from forklift.errors import ArgumentError, ConfigError
from forklift.fair import FairShare, Weights
from forklift.limits import Limit
from forklift.unique import OnConflict, Unique

if TYPE_CHECKING:
    from forklift.workers.context import JobContext

P = ParamSpec("P")
R = TypeVar("R")

# Keyword names Task.enqueue() takes for itself (JobOptions and `conn`): a handler
# parameter with one of these names could never be given through it.
ENQUEUE_OPTIONS = frozenset(JobOptions.__annotations__) | {"conn"}


class TaskOptions(TypedDict, total=False):
    """How a task's jobs are run unless an enqueue says otherwise (`@app.task(...)`).

    `queue` ("default"), `priority` (0), `max_attempts` (5), `timeout` (seconds, none),
    `backoff` (forklift.Backoff()); `max_crashes` (2): how many of its runs may kill
    their worker process (segfault, OOM kill, os._exit) before the job is quarantined,
    dead, whatever attempts are left; `limit`: a forklift.Limit on how many run at once
    and start per window, across every replica (per value of its key, if it has one);
    `fair`: a key (an argument's name, or a callable over the arguments) whose values take
    turns in line, so one value's backlog does not hold the others up; `weights`: a key
    value's share of the turns (a mapping, others 1; or a callable over the arguments),
    forklift.fair;
    `max_snoozes` (100): how many times a job may `forklift.Snooze` (run again later, its
    attempt not spent) before the next snooze counts as a failed attempt. A bound, so
    that a handler that snoozes forever (a condition that never comes) ends dead like any
    failing one, not polling without end; 100 snoozes a minute apart wait out more than
    an hour and a half of a condition not yet met (raise it for longer waits);
    `requires`: labels (e.g. {"gpu"}) a worker must have every one of, from
    `forklift run --labels`, to claim the task's jobs; a worker with them takes those
    jobs before jobs any worker may take, and no other worker takes them;
    `cost` (1): how many of its worker's `--concurrency` slots one of its jobs takes, so
    that a memory- or thread-heavy job does not start beside others that would
    oversubscribe the host (a worker whose queues take a task costing more slots than it
    has refuses to start; async handlers share the event loop, and cost 1).
    """

    queue: str
    priority: int
    max_attempts: int
    max_crashes: int
    timeout: float | None
    backoff: Backoff | None
    limit: Limit | None
    fair: str | Callable[[Mapping[str, Any]], object] | None
    weights: Weights | None
    max_snoozes: int
    unique: Unique | None  # at most one live job per key: forklift.Unique
    requires: Iterable[str]  # labels a worker must have to run its jobs (run --labels)
    cost: int  # concurrency slots one of its jobs takes on its worker (default 1)


class Producer(Protocol):
    """What a task needs of its app (forklift.App): enqueue its runs, and the bound on
    their results."""

    @property
    def max_result_bytes(self) -> int: ...

    def enqueue(
        self,
        task_name: str,
        args: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.Connection[Any] | None = None,
        **options: Unpack[JobOptions],
    ) -> int: ...

    async def enqueue_async(
        self,
        task_name: str,
        args: Mapping[str, Any] | None = None,
        *,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **options: Unpack[JobOptions],
    ) -> int: ...


def _unknown(name: str, free: list[str]) -> str:
    close = difflib.get_close_matches(name, free, n=1, cutoff=0.6)
    return f"unknown argument {name!r}" + (f" (did you mean {close[0]!r}?)" if close else "")


def _listed(what: str, names: list[str]) -> str:
    return f"{what}{'s' if len(names) > 1 else ''} {', '.join(map(repr, names))}"


def _check_options(
    name: str,
    fn: Callable[..., Any],
    max_attempts: int,
    max_crashes: int,
    timeout: float | None,
    priority: int,
) -> None:
    if max_attempts < 1:
        raise ConfigError(f"task {name!r}: max_attempts must be >= 1")
    if max_crashes < 1:
        raise ConfigError(f"task {name!r}: max_crashes must be >= 1")
    if timeout is not None and timeout <= 0:
        raise ConfigError(f"task {name!r}: timeout must be > 0 seconds")
    check_priority(priority)
    if inspect.isasyncgenfunction(fn):
        raise ConfigError(
            f"task {name!r}: a handler is a plain def or an async def, not an async "
            "generator (nothing would run its body)"
        )


def _check_reserved(name: str, params: list[str]) -> None:
    """Refuse handler parameters named like Task.enqueue()'s own options: such an
    argument could never be given through it (it would set the job's option instead)."""
    reserved = [p for p in params if p in ENQUEUE_OPTIONS]
    if reserved:
        first = reserved[0]
        raise ConfigError(
            f"task {name!r}: {_listed('parameter', reserved)} "
            f"{'are' if len(reserved) > 1 else 'is'} named like an enqueue() option: "
            f"{name}.enqueue({first}=...) sets the job's {first}, so no argument of that "
            f"name could reach the handler; rename {'them' if len(reserved) > 1 else 'it'} "
            f"(e.g. {first}_value)"
        )


def _checked_limit(name: str, limit: object, signature: inspect.Signature) -> Limit | None:
    if limit is None:
        return None
    if not isinstance(limit, Limit):
        raise ConfigError(f"task {name!r}: limit must be a forklift.Limit, got {limit!r}")
    limit.check_against(name, signature)
    return limit


def _checked_unique(name: str, unique: object, signature: inspect.Signature) -> Unique | None:
    if unique is None:
        return None
    if not isinstance(unique, Unique):
        raise ConfigError(f"task {name!r}: unique must be a forklift.Unique, got {unique!r}")
    unique.check_against(name, signature)
    return unique


def _checked_requires(name: str, value: object, limited: bool, fair: bool) -> tuple[str, ...]:
    """The labels a worker must have to run the task's jobs, sorted (none: any worker)."""
    if value is None:
        return ()
    try:
        labels = _names.check_labels(value)
    except ValueError as exc:
        raise ConfigError(f"task {name!r}: requires: {exc}") from None
    if labels and (limited or fair):
        raise ConfigError(
            f"task {name!r}: requires= with {'limit=' if limited else 'fair='} is not "
            "supported yet (jobs that require labels are claimed apart, in line order)"
        )
    return labels


def _checked_cost(name: str, value: object, is_async: bool) -> int:
    """The concurrency slots one of the task's jobs takes (workers/slots.py), read by the
    worker that runs it: no column holds it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"task {name!r}: cost must be an int >= 1, got {value!r}")
    if value > 1 and is_async:
        raise ConfigError(
            f"task {name!r}: cost= is for plain def handlers: async ones share their "
            "worker's event loop (give the task a queue of its own, with a worker of "
            "lower --concurrency, instead)"
        )
    return value


def _checked_max_snoozes(name: str, value: object) -> int:
    """The snoozes a job may take before the next is a failed attempt. Read by the worker
    that runs the job (only a worker that declares the task runs it): no column holds it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"task {name!r}: max_snoozes must be an int >= 0, got {value!r}")
    return value


class Task(Generic[P, R]):
    """A registered handler plus its defaults; `.enqueue(**kwargs)` schedules a run."""

    def __init__(
        self, app: Producer, fn: Callable[..., R], *, name: str, **options: Unpack[TaskOptions]
    ) -> None:
        queue = options.get("queue", "default")
        priority = options.get("priority", 0)
        max_attempts = options.get("max_attempts", 5)
        max_crashes = options.get("max_crashes", 2)
        timeout = options.get("timeout")
        _check_options(name, fn, max_attempts, max_crashes, timeout, priority)
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.priority = priority
        self.max_attempts = max_attempts
        # Runs that may kill their worker process before the job is quarantined (dead).
        self.max_crashes = max_crashes
        self.timeout = timeout
        self.backoff = options.get("backoff") or Backoff()
        # An async def: run on the worker's event loop (workers/aio.py), not on a thread.
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            raise ConfigError(
                f"task {name!r}: the handler's first parameter must take the JobContext"
            )
        _check_reserved(name, [p.name for p in params[1:]])
        # Precomputed for fits(): binding a signature per job is slow at bulk rates.
        by_name = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        self._names = frozenset(p.name for p in params[1:] if p.kind in by_name)
        self._required = frozenset(
            p.name
            for p in params[1:]
            if p.default is inspect.Parameter.empty
            and p.kind in (*by_name, inspect.Parameter.POSITIONAL_ONLY)
        )
        self._any_keyword = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self._positional = frozenset(
            p.name for p in params[1:] if p.kind is inspect.Parameter.POSITIONAL_ONLY
        )
        self._declare_policies(name, options)
        self._defaults = {
            p.name: p.default for p in params[1:] if p.default is not inspect.Parameter.empty
        }

    def _declare_policies(self, name: str, options: TaskOptions) -> None:
        """How its jobs are scheduled: limit, fair shares, snoozes, uniqueness, cost and
        the labels they require, each checked (ConfigError)."""
        self.limit = _checked_limit(name, options.get("limit"), self.signature)
        self.fair = FairShare.declared(
            name, options.get("fair"), options.get("weights"), self.signature
        )
        if self.fair is not None and self.limit is not None:
            raise ConfigError(
                f"task {name!r}: fair= and limit= together are not supported yet (a limited "
                "task's jobs are claimed under its limit, in line order, not in turns)"
            )
        self.max_snoozes = _checked_max_snoozes(name, options.get("max_snoozes", 100))
        # The slots of its worker's concurrency one of its jobs takes (workers/slots.py).
        self.cost = _checked_cost(name, options.get("cost", 1), self.is_async)
        # The labels a worker must have to claim its jobs (forklift run --labels), sorted.
        self.requires = _checked_requires(
            name, options.get("requires"), self.limit is not None, self.fair is not None
        )
        # At most one live job per key (forklift/unique.py): its jobs' unless they say so.
        self.unique = _checked_unique(name, options.get("unique"), self.signature)

    def limit_key(self, args: Mapping[str, Any]) -> str | None:
        """The key a job with `args` is stored with (jobs.limit_key): its limit's key's
        value, '' under a limit with no key, None with no limit."""
        if self.limit is None:
            return None
        return self.limit.key_of(self.name, args, self._defaults)

    def unique_key(self, task: str, args: Mapping[str, Any], unique: Unique) -> str:
        """The unique key of this task's job with `args` (forklift/unique.py) under
        `unique`, its own or an enqueue's, whose keys must name arguments of its handler
        (ArgumentError)."""
        if unique is not self.unique and (unknown := unique.unknown_keys(self.signature)):
            raise ArgumentError(
                f"task {self.name!r}: unique=Unique(keys=...) names "
                f"{', '.join(map(repr, unknown))}, no argument of its handler"
            )
        return unique.key_of(task, args, self._defaults)

    def fair_of(self, args: Mapping[str, Any]) -> tuple[str | None, float | None]:
        """The fair key a job with `args` is stored with (jobs.fair_key; None: not fair)
        and its weight (None: 1)."""
        if self.fair is None:
            return None, None
        return self.fair.of(self.name, args, self._defaults)

    def __call__(self, ctx: JobContext, /, **kwargs: Any) -> R:
        return self.fn(ctx, **kwargs)

    def fits(self, args: Mapping[str, Any]) -> bool:
        """True if the handler can be called as fn(ctx, **args) (a fast check)."""
        keys = args.keys()
        return self._required <= keys and (self._any_keyword or keys <= self._names)

    def misfit(self, args: Mapping[str, Any]) -> str | None:
        """Why `args` do not fit the handler's keyword parameters (None if they do): every
        unknown argument, with the parameter it may have meant, and every missing one.

        `unknown argument 'txt' (did you mean 'text'?); missing required argument 'text'`
        """
        if self.fits(args):
            return None
        keys = set(args)
        unknown = [] if self._any_keyword else sorted(keys - self._names)
        missing = sorted(self._required - keys - self._positional)
        free = sorted(self._names - keys)  # what an unknown name may have meant
        problems = [
            f"argument {name!r} is positional-only (a job's arguments are passed by name)"
            if name in self._positional
            else _unknown(name, free)
            for name in unknown
        ]
        if missing:
            problems.append(_listed("missing required argument", missing))
        if problems:
            return "; ".join(problems)
        try:  # what the counts above do not see (a positional-only parameter by name)
            self.signature.bind(None, **args)
        except TypeError as exc:
            return str(exc)
        return None

    def check_args(self, args: Mapping[str, Any]) -> None:
        """Raise ArgumentError if `args` do not fit the handler's keyword parameters."""
        if self.fits(args):
            return
        problem = self.misfit(args)
        if problem is not None:
            raise ArgumentError(f"task {self.name!r}: {problem}")

    def enqueue(
        self,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        max_crashes: int | None = None,
        unique: Unique | Literal[False] | None = None,
        on_conflict: OnConflict | None = None,
        conn: psycopg.Connection[Any] | None = None,
        **kwargs: Any,
    ) -> int:
        """Enqueue a run with `kwargs` as the handler's arguments; return the job id."""
        return self.app.enqueue(
            self.name,
            kwargs,
            idempotency_key=idempotency_key,
            run_at=run_at,
            delay=delay,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
            max_crashes=max_crashes,
            unique=unique,
            on_conflict=on_conflict,
            conn=conn,
        )

    async def enqueue_async(
        self,
        *,
        idempotency_key: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        priority: int | None = None,
        queue: str | None = None,
        max_attempts: int | None = None,
        max_crashes: int | None = None,
        unique: Unique | Literal[False] | None = None,
        on_conflict: OnConflict | None = None,
        conn: psycopg.AsyncConnection[Any] | None = None,
        **kwargs: Any,
    ) -> int:
        """enqueue() for asyncio code (App.enqueue_async): in `conn`'s transaction, or on
        the producer's pool in a thread."""
        return await self.app.enqueue_async(
            self.name,
            kwargs,
            idempotency_key=idempotency_key,
            run_at=run_at,
            delay=delay,
            priority=priority,
            queue=queue,
            max_attempts=max_attempts,
            max_crashes=max_crashes,
            unique=unique,
            on_conflict=on_conflict,
            conn=conn,
        )
