"""Loading the App a command names (MODULE:APP): import its module, find the App in it."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from typing import TYPE_CHECKING, Any

from forklift.errors import AppImportError, ConfigError

if TYPE_CHECKING:
    from forklift.app import App


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
