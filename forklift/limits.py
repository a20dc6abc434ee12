"""Limits: how many of a task's jobs may run at once and how many may start per window,
across every replica, per task or per value of a key.

    @app.task(limit=forklift.Limit(concurrency=1, key="account"))
    def charge(ctx, *, account: str, cents: int) -> None: ...

A claim of jobs under a limit takes the limit's lock (an advisory transaction lock keyed
by the limit's id), then counts what runs (and what started in the rate window) in a
fresh snapshot, in the same transaction: exact with any number of replicas, and nothing
to free when a worker dies (its jobs stop counting the moment they are charged).
See store/limits.sql.
"""

from __future__ import annotations

import inspect
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from forklift.errors import ArgumentError, ConfigError

# A key's value as stored (jobs.limit_key): the argument's text, or its JSON.
KEY_BYTES = 200
Key = str | Callable[[Mapping[str, Any]], object]


@dataclass(frozen=True)
class Limit:
    """At most `concurrency` running at once and `rate` starts in any window of `per`
    seconds (a sliding window), across all replicas; per value of `key` (an argument's
    name, or a callable over the arguments evaluated at enqueue) when given.

    A full burst of `rate` may start at once; then nothing more until starts slide out
    of the window. The window is kept in hundredths of `per`, so a steady stream gets
    100/101 of `rate`, never more.
    """

    concurrency: int | None = None
    rate: int | None = None
    per: float = 1.0
    key: Key | None = None

    def __post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise ConfigError("Limit: give concurrency=, rate= or both")
        for name in ("concurrency", "rate"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigError(f"Limit: {name} must be a whole number >= 1, got {value!r}")
        if isinstance(self.per, bool) or not isinstance(self.per, int | float):
            raise ConfigError(f"Limit: per must be seconds (a number), got {self.per!r}")
        if not math.isfinite(self.per) or self.per <= 0:
            raise ConfigError(f"Limit: per must be > 0 seconds, got {self.per!r}")
        if self.key is not None and not (isinstance(self.key, str) or callable(self.key)):
            raise ConfigError(
                f"Limit: key must be an argument name or a callable, got {self.key!r}"
            )
        if isinstance(self.key, str) and not self.key.isidentifier():
            raise ConfigError(f"Limit: key {self.key!r} is not an argument name")

    @property
    def key_arg(self) -> str | None:
        return self.key if isinstance(self.key, str) else None

    def check_against(self, task: str, signature: inspect.Signature) -> None:
        """A key naming an argument the handler does not take is a ConfigError."""
        check_key_arg(f"Limit(key={self.key_arg!r})", task, self.key_arg, signature)

    def key_of(self, task: str, args: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
        """The key value of a job with `args`, as stored ('' when not keyed)."""
        if self.key is None:
            return ""
        return key_value(f"task {task!r}: its limit's key", self.key, args, defaults)


def key_value(what: str, key: Key, args: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """The value of `key` (an argument's name, or a callable over the arguments) for a job
    with `args` (and its handler's `defaults`), as stored; `what` names it in the
    ArgumentError that refuses a missing one, a callable that raised, or one too long."""
    if isinstance(key, str):
        if key in args:
            value = args[key]
        elif key in defaults:
            value = defaults[key]
        else:
            raise ArgumentError(f"{what} {key!r} is missing")
    else:
        try:
            value = key(args)
        except Exception as exc:
            raise ArgumentError(f"{what} raised {type(exc).__name__}: {exc}") from exc
    text = key_text(value)
    if len(text.encode()) > KEY_BYTES:
        raise ArgumentError(f"{what} is {len(text.encode())} bytes, at most {KEY_BYTES}")
    return text


def check_key_arg(what: str, task: str, name: str | None, signature: inspect.Signature) -> None:
    """A key naming an argument (`name`) the handler does not take is a ConfigError;
    `what` names the key in it."""
    if name is None:
        return
    params = list(signature.parameters.values())[1:]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    if name not in {p.name for p in params}:
        taken = ", ".join(p.name for p in params) or "none"
        raise ConfigError(
            f"task {task!r}: {what} names no argument of its handler (it takes: {taken})"
        )


def key_text(value: object) -> str:
    """A key's value as stored: a string as it is, anything else as its JSON."""
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))


def key_from_args(args: str, name: str | None) -> str:
    """The key of a job whose arguments are the JSON text `args`, under a limit keyed by
    argument `name` (a producer that does not declare the task; None: a limit with no
    key, or keyed by a callable it cannot call): '' if it has no such argument, or the
    value is too long (such jobs share one key)."""
    if name is None:
        return ""
    value = json.loads(args).get(name)
    if value is None:
        return ""
    text = key_text(value)
    return text if len(text.encode()) <= KEY_BYTES else ""
