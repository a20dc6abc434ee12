"""Passwords hidden from any text shown or logged: where they stand in DSNs (URL and
key=value forms), and the pieces of malformed DSNs' passwords this process was given (no
psycopg here: the CLI and the log formatter use it before anything connects)."""

from __future__ import annotations

import re
from collections.abc import Iterable

_URL_PASSWORD = re.compile(r"(://[^:/@\s]*:)[^@\s]*@")
_KV_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)

# Literal pieces of the passwords of malformed DSNs this process was given, longest
# first (_db.remember_secrets adds them), and the pattern that finds them as whole words.
_SECRETS: tuple[str, ...] = ()
_SECRET_WORDS: re.Pattern[str] | None = None


def redact(text: str) -> str:
    """Hide the password of any DSN (URL or key=value form) inside `text`, where it
    stands; and each piece of a malformed DSN's password this process was given,
    wherever it appears as a word of its own (such a DSN's password shows up cut in
    pieces, as a host name, where no pattern finds it). A piece inside a longer word is
    left alone: password `bench` must not turn `task=bench_job` into `task=***_job`."""
    text = _KV_PASSWORD.sub(r"\1***", _URL_PASSWORD.sub(r"\1***@", text))
    words = _words()
    if words is not None:
        text = words.sub("***", text)
    return text


def _words() -> re.Pattern[str] | None:
    global _SECRET_WORDS
    if not _SECRETS:
        return None
    if _SECRET_WORDS is None or _SECRET_WORDS.pattern != _pattern(_SECRETS):
        _SECRET_WORDS = re.compile(_pattern(_SECRETS))
    return _SECRET_WORDS


def _pattern(secrets: tuple[str, ...]) -> str:
    return r"(?<!\w)(?:" + "|".join(map(re.escape, secrets)) + r")(?!\w)"


def secrets() -> tuple[str, ...]:
    """The pieces of passwords redact() hides wherever they appear as words."""
    return _SECRETS


def hide(pieces: Iterable[str]) -> None:
    """Have redact() hide each of `pieces` wherever it appears as a word, from now on."""
    global _SECRETS
    _SECRETS = tuple(sorted({*pieces, *_SECRETS}, key=len, reverse=True))
