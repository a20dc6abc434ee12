"""Unique jobs: at most one live job per key, enforced by the database.

    @app.task(unique=forklift.Unique(keys=["account"], period=60))
    def sync_account(ctx, *, account: str, full: bool = False) -> None: ...

A unique job is stored with its key (jobs.unique_key: a SHA-256 of its task, the
declaration and the arguments named by `keys`, computed by the producer; with a
`period`, followed by `@` and the number of the period the database's clock is in at
insert) and the states its key holds in (jobs.unique_states, a bitmask). A partial unique
index (migration 0022) admits one row per key among the rows whose state is in their
own set, so two producers, replicas or a bulk enqueue racing a single one cannot both
insert: the second meets the index, not a check that the first had not committed yet.
A job that moves to a state outside its set leaves the index by itself.

Its states always include `ready` and `running`: a job moves between them on its own
(a failure with attempts left, a graceful stop's release, a snooze, a lost lease), and
a move back into a set it had left could meet another job's key in a worker's write.
River requires the same of its unique states. `succeeded`, `dead` and `cancelled` may
be added, so that a finished job keeps holding its key (until retention prunes it, or
its period passes).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from forklift._json import as_dict, one_shot
from forklift.errors import ArgumentError, ConfigError

OnConflict = Literal["keep", "replace", "raise"]
ON_CONFLICT: frozenset[str] = frozenset({"keep", "replace", "raise"})

# Each job state's bit in jobs.unique_states: the schema's unique_holds() says the same.
STATE_BITS = {"blocked": 1, "ready": 2, "running": 4, "succeeded": 8, "dead": 16, "cancelled": 32}
REQUIRED = frozenset({"ready", "running"})
# A unique job is never a workflow's, so never blocked: naming it would mean nothing.
ALLOWED = frozenset(STATE_BITS) - {"blocked"}
DEFAULT_STATES = REQUIRED


@dataclass(frozen=True)
class Unique:
    """At most one live job per key: a job's key is its task and the values of the
    arguments named in `keys` (None: all of them); within each `period` seconds when
    given (by the database's clock), and among the jobs in `states` (ready and running,
    always; succeeded, dead or cancelled as well if named). Checked when built
    (ConfigError)."""

    keys: Sequence[str] | None = None
    period: float | None = None
    states: Collection[str] = field(default=DEFAULT_STATES)

    def __post_init__(self) -> None:
        object.__setattr__(self, "keys", _checked_keys(self.keys))
        object.__setattr__(self, "period", _checked_period(self.period))
        object.__setattr__(self, "states", _checked_states(self.states))

    @functools.cached_property
    def mask(self) -> int:
        """The states as jobs.unique_states holds them (STATE_BITS)."""
        return sum(STATE_BITS[state] for state in self.states)

    def check_against(self, task: str, signature: inspect.Signature) -> None:
        """A key naming no argument of the handler is a ConfigError (a handler taking
        **kwargs may be given any)."""
        missing = self.unknown_keys(signature)
        if missing:
            params = list(signature.parameters.values())[1:]
            taken = ", ".join(p.name for p in params) or "none"
            raise ConfigError(
                f"task {task!r}: Unique(keys=...) names {', '.join(map(repr, missing))}, "
                f"no argument of its handler (it takes: {taken})"
            )

    def unknown_keys(self, signature: inspect.Signature) -> list[str]:
        """The keys that name no argument of a handler with `signature`."""
        params = list(signature.parameters.values())[1:]
        if self.keys is None or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
            return []
        names = {p.name for p in params}
        return [key for key in self.keys if key not in names]

    def key_of(self, task: str, args: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
        """The key a job of `task` with `args` is stored under (before its period's
        number): a SHA-256, in hex, of the task, this declaration, and the values of its
        keys, the handler's defaults standing in for arguments not given. An argument
        neither given nor defaulted counts as absent, apart from any value."""
        given = {**defaults, **args}
        names = sorted(given) if self.keys is None else self.keys
        values = {name: given[name] for name in names if name in given}
        what = [task, self.period, self.mask, values]
        try:
            text = _key_text(what)
        except (TypeError, ValueError, RecursionError) as exc:
            raise ArgumentError(f"task {task!r}: its unique key's values: {exc}") from None
        return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# Built once: sorted keys, so that the same arguments given in another order make the
# same key. (Keys are stored: this text may never change, byte for byte.)
_key_text = one_shot(
    json.JSONEncoder(
        sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
        default=as_dict,
    )
)  # fmt: skip


def _checked_keys(keys: object) -> tuple[str, ...] | None:
    if keys is None:
        return None
    if isinstance(keys, str) or not isinstance(keys, Iterable):
        raise ConfigError(f"Unique: keys must be a list of argument names, got {keys!r}")
    found = tuple(keys)
    if not found:
        raise ConfigError("Unique: keys=[] names no argument: give None for all of them")
    for key in found:
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"Unique: key {key!r} is not an argument name")
    return found


def _checked_period(period: object) -> float | None:
    if period is None:
        return None
    if isinstance(period, bool) or not isinstance(period, int | float):
        raise ConfigError(f"Unique: period must be seconds (a number), got {period!r}")
    if not math.isfinite(period) or period <= 0:
        raise ConfigError(f"Unique: period must be > 0 seconds, got {period!r}")
    return float(period)


def _checked_states(states: object) -> frozenset[str]:
    if isinstance(states, str) or not isinstance(states, Iterable):
        raise ConfigError(f"Unique: states must be a set of job states, got {states!r}")
    found = frozenset(states)
    unknown = sorted(str(s) for s in found if s not in STATE_BITS)
    if unknown:
        raise ConfigError(
            f"Unique: unknown job state(s) {', '.join(map(repr, unknown))} "
            f"(states are {', '.join(sorted(ALLOWED))})"
        )
    if "blocked" in found:
        raise ConfigError("Unique: 'blocked' is a workflow job's state; a unique job is never one")
    if not found >= REQUIRED:
        raise ConfigError(
            "Unique: states must include 'ready' and 'running' (a job moves between them "
            f"by itself: a retry, a release), got {sorted(found)}"
        )
    return found
