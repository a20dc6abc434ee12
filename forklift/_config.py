"""Flags, then FORKLIFT_* environment variables, then defaults; plus value parsers."""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from forklift.errors import AppImportError, ConfigError

if TYPE_CHECKING:
    from forklift.app import App

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


def env(name: str, parse: Callable[[str], T], default: T) -> T:
    """The FORKLIFT_<name> variable parsed, else `default`; a bad value is a ConfigError."""
    raw = os.environ.get(f"FORKLIFT_{name}")
    if raw is None or raw == "":
        return default
    try:
        return parse(raw)
    except (argparse.ArgumentTypeError, ValueError) as exc:
        raise ConfigError(f"FORKLIFT_{name}={raw!r}: {exc}") from None


def _import(module_name: str, target: str) -> Any:
    """Import the app's module; anything it raises becomes one AppImportError line
    (the original stays its __cause__, for --debug)."""
    try:
        return importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise AppImportError(
                f"cannot import {target}: no module named {exc.name!r} (forklift looks in "
                f"the current directory, {os.getcwd()}, and on PYTHONPATH)"
            ) from exc
        raise AppImportError(f"cannot import {target}: {_where(exc)}") from exc
    except (Exception, SystemExit) as exc:
        raise AppImportError(f"cannot import {target}: {_where(exc)}") from exc


def _where(exc: BaseException) -> str:
    """`TypeError: boom (at app/jobs.py:12)`: the error and the innermost frame."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    frames = traceback.extract_tb(exc.__traceback__)
    if frames:
        text += f" (at {frames[-1].filename}:{frames[-1].lineno})"
    return text


def load_app(target: str) -> App:
    """Import 'package.module:attribute' and return the App it names."""
    from forklift.app import App  # the app's module imports it anyway

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"{target!r}: expected MODULE:APP, e.g. myproject.jobs:app")
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module = _import(module_name, target)
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"{target!r}: module {module_name!r} has no {part!r}") from None
    if not isinstance(obj, App):
        raise ConfigError(f"{target!r} is a {type(obj).__name__}, not a forklift.App")
    return obj
