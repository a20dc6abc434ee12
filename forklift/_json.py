"""Validate and encode job arguments as JSON that a jsonb column can hold."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from typing import Any

from forklift.errors import ArgumentError, ResultError

# What a job may store as its result, its checkpoint or a step's result: 1 MiB of JSON.
MAX_RESULT_BYTES = 1 << 20

_MAX_DEPTH = 100
MAX_ARG_BYTES = 1 << 20  # a job's arguments, as JSON: 1 MiB, as for its result


class _Refused(Exception):
    """A value jsonb cannot hold; `path` collects the keys on the way back up."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        self.path: list[str] = []

    def message(self, whole: str) -> str:
        """`['a'][0]: nan is not valid JSON (NaN/Infinity)`; `whole` names an empty path."""
        return f"{''.join(reversed(self.path)) or whole}: {self.reason}"


def _check_text(text: str, *, key: bool = False) -> None:
    """Refuse text with a NUL or that is not valid Unicode (`key`: a mapping's key, which
    the refusal names). Plain ASCII without a NUL, nearly all text, returns at once: no
    message is formatted for text nothing is wrong with."""
    if "\x00" not in text and text.isascii():
        return
    what = f"key {text!r}" if key else "string"
    if "\x00" in text:
        raise _Refused(f"{what} contains a NUL character (\\u0000)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise _Refused(f"{what} is not valid Unicode") from None


def _check(value: Any, depth: int) -> None:
    # Exact-type fast paths first: this runs for every value of every enqueued job.
    kind = type(value)
    if kind is str:
        _check_text(value)
    elif kind is int or kind is bool or value is None:
        return
    elif kind is float:
        if not math.isfinite(value):
            raise _Refused(f"{value!r} is not valid JSON (NaN/Infinity)")
    elif kind is dict or isinstance(value, Mapping):
        if depth >= _MAX_DEPTH:
            raise _Refused(f"nested deeper than {_MAX_DEPTH} levels")
        for key, item in value.items():
            if type(key) is not str and not isinstance(key, str):
                raise _Refused(f"key {key!r} is not a string")
            _check_text(key, key=True)
            leaf = type(item)
            if leaf is int or leaf is bool or item is None:
                continue  # nothing to refuse: no call for the commonest values
            try:
                _check(item, depth + 1)
            except _Refused as refused:
                refused.path.append(f"[{key!r}]")
                raise
    elif kind is list or kind is tuple or isinstance(value, list | tuple):
        if depth >= _MAX_DEPTH:
            raise _Refused(f"nested deeper than {_MAX_DEPTH} levels")
        for i, item in enumerate(value):
            try:
                _check(item, depth + 1)
            except _Refused as refused:
                refused.path.append(f"[{i}]")
                raise
    elif isinstance(value, str):
        _check_text(value)
    elif isinstance(value, int):  # bool and int subclasses (IntEnum)
        return
    elif isinstance(value, float):
        _check(float(value), depth)
    else:
        raise _Refused(
            f"{type(value).__name__} is not JSON (use str, int, float, bool, None, list or dict)"
        )


def check(value: Any) -> None:
    """Raise ArgumentError naming the key path of the first value jsonb cannot hold."""
    try:
        _check(value, 0)
    except _Refused as refused:
        raise ArgumentError(refused.message("args")) from None


def one_shot(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """`encoder.encode` (of ensure_ascii=False, no indent) without what it redoes per
    call: JSONEncoder.iterencode builds a new C encoder (and its dict of the containers
    seen) for every value, which made encoding `{"n": 5}` take 1.4 µs here instead of
    0.5. This one is built once, without that dict, so a container nested in itself
    recurses (RecursionError) instead of raising ValueError: check() refuses one (as too
    deep) before any encoding. The same text, byte for byte. `encoder.encode` where the
    C accelerator is missing."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None or encoder.ensure_ascii or encoder.indent is not None:
        return encoder.encode
    chunks = make(
        None, encoder.default, json.encoder.encode_basestring, None, encoder.key_separator,
        encoder.item_separator, encoder.sort_keys, encoder.skipkeys, encoder.allow_nan,
    )  # fmt: skip
    return lambda value: "".join(chunks(value, 0))


def as_dict(value: Any) -> Any:
    """JSONEncoder's `default`: a Mapping as a dict (check() admitted any Mapping; json
    only encodes dicts itself); anything else is not JSON (TypeError)."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON")


_encode = one_shot(
    json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=as_dict)
)


def dumps_args(args: Mapping[str, Any], max_bytes: int = MAX_ARG_BYTES) -> str:
    """Validate `args` (a mapping of keyword arguments) and encode it as JSON text of at
    most `max_bytes` bytes (UTF-8)."""
    if not isinstance(args, Mapping):
        raise ArgumentError(
            f"args: expected a dict of keyword arguments, got {type(args).__name__}"
        )
    check(args)
    text = _encode(args)
    size = _size(text)
    if size > max_bytes:
        raise ArgumentError(
            f"args are {size:,} bytes of JSON, more than the {max_bytes:,} a job may take "
            "(App(max_arg_bytes=...) or FORKLIFT_MAX_ARG_BYTES); store big inputs "
            "elsewhere and pass where they are"
        )
    return text


def _size(text: str) -> int:
    """`text`'s length in UTF-8 bytes (without encoding it when it is ASCII)."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def dumps_result(value: Any, max_bytes: int, what: str = "the result") -> str:
    """Validate a handler's return value (or `what` else it is: a checkpoint, a step's
    result) and encode it as JSON text of at most `max_bytes` bytes (UTF-8); ResultError
    says what is wrong with it."""
    try:
        _check(value, 0)
    except _Refused as refused:
        raise ResultError(refused.message(what)) from None
    text = _encode(value)
    size = _size(text)
    if size > max_bytes:
        raise ResultError(
            f"{what} is {size:,} bytes of JSON, more than the {max_bytes:,} a job may "
            "store (App(max_result_bytes=...)); store big outputs elsewhere and keep "
            "where they are"
        )
    return text
