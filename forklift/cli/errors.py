"""How the CLI ends: exit codes, and one line per error (a traceback only with --debug)."""

from __future__ import annotations

import re
import sys
import traceback
from enum import IntEnum

from forklift import _display
from forklift._redact import redact
from forklift.errors import AppImportError, DsnError, ForkliftError, NoDatabase


class Exit(IntEnum):
    """forklift's exit codes (documented in README and `forklift --help`)."""

    OK = 0
    ERROR = 1  # the command failed: database, bad job, bad configuration
    USAGE = 2  # the command line is wrong, or the database URL does not parse
    APP_IMPORT = 3  # MODULE:APP does not import
    INTERRUPTED = 130  # Ctrl-C


_LINE_BREAK = re.compile(r"[ \t]*\n[ \t]*")

# The library's words for a missing database name App(dsn=...); a command line has --dsn.
NO_DATABASE = "no database: pass --dsn or set FORKLIFT_DATABASE_URL (or DATABASE_URL)"


class UsageError(ForkliftError):
    """The command line is wrong (exit 2)."""


class Refused(ForkliftError):
    """The command would most likely do what was not meant; a flag says it was (exit 1)."""


def report(exc: BaseException, *, debug: bool) -> int:
    """Print `exc` as one line on stderr (plus its traceback with --debug); the exit code.
    Both are redacted (no DSN password) and escaped (a handler's error may hold escape
    sequences)."""
    if debug:
        text = "".join(traceback.format_exception(exc))
        print(_display.block(redact(text)).rstrip("\n"), file=sys.stderr)
    hint = "; --debug shows the traceback" if isinstance(exc, AppImportError) and not debug else ""
    # libpq's messages come in lines ("Connection refused\n\tIs the server running"):
    # one line of them here; anything else that would move the cursor shows escaped.
    text = str(exc)
    if isinstance(exc, NoDatabase):
        text = f"{NO_DATABASE}; {exc.reason}" if exc.reason else NO_DATABASE
    message = _display.line(_LINE_BREAK.sub(" ", redact(text).strip()))
    print(f"forklift: error: {message}{hint}", file=sys.stderr)
    if isinstance(exc, UsageError | DsnError):
        return Exit.USAGE
    if isinstance(exc, AppImportError):
        return Exit.APP_IMPORT
    return Exit.ERROR


def handled(exc: BaseException) -> bool:
    """Whether `exc` ends a command with one line (else it is a bug: its traceback shows).

    forklift's own errors, and the database driver's: psycopg is imported only by the
    commands that connect, and none of its errors can come from one that did not."""
    if isinstance(exc, ForkliftError):
        return True
    psycopg = sys.modules.get("psycopg")
    return psycopg is not None and isinstance(exc, psycopg.Error)
