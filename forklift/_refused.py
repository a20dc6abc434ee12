"""Errors no retry fixes: the database refuses forklift's role or password (SQLSTATE
class 28) or has no such database (3D000).

A refused connection carries no SQLSTATE in psycopg (libpq keeps only the server's
message), so the server's own sentence (and PgBouncer's) is recognised as well.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import psycopg

from forklift._redact import redact

REFUSED_CLASS = "28"  # invalid authorization specification: role, password, pg_hba.conf
NO_DATABASE = "3D000"  # invalid catalog name: the database does not exist
# The server's (and PgBouncer's) sentences for them, as libpq passes them on.
_REFUSED_TEXT = re.compile(
    r"authentication failed|(?:role|database) \"[^\"]*\" does not exist|pg_hba\.conf"
    r"|not permitted to log in|no such (?:database|user)",
    re.IGNORECASE,
)
_FATAL = re.compile(r"FATAL:\s*(.*)")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def refusal(exc: BaseException) -> str | None:
    """Why the database refuses forklift for good, in the server's words (with its
    SQLSTATE when known), if `exc` or its cause says so; None for any other error."""
    for error in _chain(exc):
        if not isinstance(error, psycopg.Error):
            continue
        state = error.sqlstate
        text = " ".join(str(error).split())
        found = _FATAL.search(text)
        sentence = redact(found[1] if found else text)
        if state is not None and (state.startswith(REFUSED_CLASS) or state == NO_DATABASE):
            return f"{sentence} (SQLSTATE {state})"
        if state is None and _REFUSED_TEXT.search(text):
            return sentence
    return None
