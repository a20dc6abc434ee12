"""Fair shares: the jobs of a task declared `fair=` take turns across the values of a key
(the tenant, the account), so one key's backlog does not make every other key wait
behind it.

    @app.task(fair="account", weights={"gold-account": 3})
    def render(ctx, *, account: str, page: int) -> None: ...

A job's key (and its weight: 1 unless `weights` says otherwise) is stored with it at
enqueue; its turn in line is dealt by the database as it is inserted (migration 0023),
and claims take the fair jobs of a queue in turn order (store/fair.sql). Work-conserving:
a key alone gets every slot; with others waiting, each key gets one job per turn (a key
weighted 3, three). Nothing is reserved, counted or kept per key.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from forklift.errors import ArgumentError, ConfigError
from forklift.limits import Key, check_key_arg, key_value

Weights = Mapping[str, float] | Callable[[Mapping[str, Any]], float]
MAX_WEIGHT = 1000.0


@dataclass(frozen=True)
class FairShare:
    """A task's fair shares: `key`, an argument's name or a callable over the arguments;
    `weights`, a key value's weight (a mapping, others 1) or a callable over the
    arguments that returns a job's weight."""

    key: Key
    weights: Weights | None = None

    @classmethod
    def declared(
        cls, task: str, key: object, weights: object, signature: inspect.Signature
    ) -> FairShare | None:
        """The fair shares `@app.task(fair=key, weights=weights)` declares (None: not
        fair), checked against the handler's `signature` (ConfigError)."""
        if key is None:
            if weights is not None:
                raise ConfigError(f"task {task!r}: weights= needs fair= (the key they weigh)")
            return None
        if not (isinstance(key, str) and key.isidentifier()) and not callable(key):
            raise ConfigError(
                f"task {task!r}: fair must be an argument name or a callable over the "
                f"arguments, got {key!r}"
            )
        if weights is not None and not (isinstance(weights, Mapping) or callable(weights)):
            raise ConfigError(
                f"task {task!r}: weights must be a mapping of key values to weights or a "
                f"callable over the arguments, got {weights!r}"
            )
        if isinstance(weights, Mapping):
            for value, weight in weights.items():
                _check_weight(f"task {task!r}: weights[{value!r}]", weight, ConfigError)
        check_key_arg(f"fair={key!r}", task, key if isinstance(key, str) else None, signature)
        return cls(key, weights)

    def of(
        self, task: str, args: Mapping[str, Any], defaults: Mapping[str, Any]
    ) -> tuple[str, float | None]:
        """The key a job with `args` is stored with, and its weight (None: 1)."""
        key = key_value(f"task {task!r}: its fair key", self.key, args, defaults)
        if self.weights is None:
            return key, None
        if isinstance(self.weights, Mapping):
            weight = self.weights.get(key)
        else:
            try:
                weight = self.weights(args)
            except Exception as exc:
                raise ArgumentError(
                    f"task {task!r}: its weights raised {type(exc).__name__}: {exc}"
                ) from exc
            _check_weight(f"task {task!r}: its weight", weight, ArgumentError)
        return key, None if weight is None or weight == 1 else float(weight)


def _check_weight(what: str, weight: object, error: type[Exception]) -> None:
    if (
        isinstance(weight, bool)
        or not isinstance(weight, int | float)
        or not math.isfinite(weight)
        or not 0 < weight <= MAX_WEIGHT
    ):
        raise error(f"{what} must be a number > 0 and <= {MAX_WEIGHT:g}, got {weight!r}")
