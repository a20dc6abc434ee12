"""Passwords hidden from any text shown or logged: the DSN patterns, and the pieces of
the passwords this process was given (no psycopg here: the CLI and the log formatter
use it before anything connects)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)

# Literal pieces of the passwords of the DSNs this process was given, longest first: what
# redact() hides even where no pattern finds it (_db.remember_secrets adds them).
_SECRETS: tuple[str, ...] = ()


def redact(text: str) -> str:
    """Hide passwords of any DSN (URL or key=value form) inside `text`, and the password
    of every DSN this process was given wherever it appears (a malformed DSN's password
    shows up cut in pieces, as a host name, where no pattern finds it)."""
    text = _KV_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
    for secret in _SECRETS:
        text = text.replace(secret, "***")
    return text


def secrets() -> tuple[str, ...]:
    """The pieces of passwords redact() hides wherever they appear."""
    return _SECRETS


def hide(pieces: Iterable[str]) -> None:
    """Have redact() hide each of `pieces` wherever it appears, from now on."""
    global _SECRETS
    _SECRETS = tuple(sorted({*pieces, *_SECRETS}, key=len, reverse=True))
