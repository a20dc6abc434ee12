"""How the CLI ends: exit codes, and one line per error (a traceback only with --debug)."""

from __future__ import annotations

import sys
import traceback
from enum import IntEnum

import psycopg

from forklift import _db
from forklift.errors import AppImportError, ForkliftError


class Exit(IntEnum):
    """forklift's exit codes (documented in README and `forklift --help`)."""

    OK = 0
    ERROR = 1  # the command failed: database, bad job, bad configuration
    USAGE = 2  # the command line is wrong
    APP_IMPORT = 3  # MODULE:APP does not import
    INTERRUPTED = 130  # Ctrl-C


class UsageError(ForkliftError):
    """The command line is wrong (exit 2)."""


def report(exc: BaseException, *, debug: bool) -> int:
    """Print `exc` as one line on stderr (plus its traceback with --debug); the exit code."""
    if debug:
        traceback.print_exception(exc, file=sys.stderr)
    hint = "; --debug shows the traceback" if isinstance(exc, AppImportError) and not debug else ""
    print(f"forklift: error: {_db.redact(str(exc))}{hint}", file=sys.stderr)
    if isinstance(exc, UsageError):
        return Exit.USAGE
    if isinstance(exc, AppImportError):
        return Exit.APP_IMPORT
    return Exit.ERROR


HANDLED = (ForkliftError, psycopg.Error)
