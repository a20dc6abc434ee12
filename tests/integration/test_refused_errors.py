"""A refusal is reported, never retried: a loop that reads again while the database is
unavailable raises at once what the database refused (here a check constraint)."""

from __future__ import annotations

import time

import psycopg
import pytest
from psycopg import errors as pg

from forklift import _db
from forklift._waiting import Ends, wait_for_end
from forklift.errors import DatabaseError
from forklift.store import translated


def test_a_wait_raises_a_refused_read_at_once(dsn: str) -> None:
    ends = Ends(dsn, deaf=True)  # no listener: the wait reads on a timer
    calls = 0
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE positive (n integer CHECK (n > 0))")

        def check() -> int | None:
            nonlocal calls
            calls += 1
            with translated("reading the answer failed"):  # the second read is refused
                conn.execute("INSERT INTO positive VALUES (%s)", [1 if calls == 1 else -calls])
            return None

        began = time.monotonic()
        with pytest.raises(DatabaseError) as caught:
            wait_for_end(ends, "forklift", "j1", check, timeout=10.0)
        took = time.monotonic() - began
    assert caught.value.cause_class is pg.CheckViolation
    assert caught.value.sqlstate == "23514" and not _db.transient(caught.value)
    assert calls == 2  # read once more after the refusal, it would be refused again
    assert took < 5.0  # not at the deadline
