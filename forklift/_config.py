"""Flags, then FORKLIFT_* environment variables, then defaults; plus value parsers."""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable
from typing import TypeVar

from forklift import _names
from forklift.errors import ConfigError

T = TypeVar("T")

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def duration(text: str) -> float:
    """Parse '250ms', '10s', '5m', '1h', '2d' or plain seconds into seconds."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (examples: 10, 10s, 250ms, 5m, 1h)"
        )
    return float(match[1]) * _UNITS[match[2]]


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def queue_list(text: str) -> tuple[str, ...]:
    queues = tuple(q.strip() for q in text.split(",") if q.strip())
    if not queues:
        raise argparse.ArgumentTypeError("name at least one queue, e.g. default,emails")
    return queues


def label_list(text: str) -> tuple[str, ...]:
    """`--labels gpu,model-x`: the labels, sorted; an empty list is none."""
    try:
        return _names.check_labels(q.strip() for q in text.split(",") if q.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def env(name: str, parse: Callable[[str], T], default: T) -> T:
    """The FORKLIFT_<name> variable parsed, else `default`; a bad value is a ConfigError."""
    raw = os.environ.get(f"FORKLIFT_{name}")
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ConfigError(f"FORKLIFT_{name}={raw!r}: {exc}") from None
