"""Validate and encode job arguments as JSON that a jsonb column can hold."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from forklift.errors import ArgumentError

_MAX_DEPTH = 100


def _where(path: str) -> str:
    return path or "args"


def check(value: Any, path: str = "", depth: int = 0) -> None:
    """Raise ArgumentError naming the key path of the first value jsonb cannot hold."""
    if depth > _MAX_DEPTH:
        raise ArgumentError(f"{_where(path)}: nested deeper than {_MAX_DEPTH} levels")
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ArgumentError(f"{_where(path)}: {value!r} is not valid JSON (NaN/Infinity)")
        return
    if isinstance(value, str):
        if "\x00" in value:
            raise ArgumentError(f"{_where(path)}: string contains a NUL character (\\u0000)")
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise ArgumentError(f"{_where(path)}: string is not valid Unicode") from None
        return
    if isinstance(value, list | tuple):
        for i, item in enumerate(value):
            check(item, f"{path}[{i}]", depth + 1)
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ArgumentError(f"{_where(path)}: key {key!r} is not a string")
            if "\x00" in key:
                raise ArgumentError(f"{_where(path)}: key {key!r} contains a NUL character")
            if not key.isascii():
                try:
                    key.encode("utf-8")
                except UnicodeEncodeError:
                    raise ArgumentError(
                        f"{_where(path)}: key {key!r} is not valid Unicode"
                    ) from None
            check(item, f"{path}[{key!r}]", depth + 1)
        return
    raise ArgumentError(
        f"{_where(path)}: {type(value).__name__} is not JSON "
        "(use str, int, float, bool, None, list or dict)"
    )


def dumps_args(args: Mapping[str, Any]) -> str:
    """Validate `args` (a mapping of keyword arguments) and encode it as JSON text."""
    if not isinstance(args, Mapping):
        raise ArgumentError(
            f"args: expected a dict of keyword arguments, got {type(args).__name__}"
        )
    check(args)
    return json.dumps(
        args, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=_as_dict
    )


def _as_dict(value: Any) -> Any:
    # check() admitted any Mapping; json only encodes dicts itself.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
