"""Which database errors no retry fixes (forklift/_refused.py)."""

from __future__ import annotations

import psycopg
import pytest

from forklift._refused import refusal
from forklift.errors import DatabaseError

PREFIX = 'connection failed: connection to server at "127.0.0.1", port 5432 failed: FATAL:  '


@pytest.mark.parametrize(
    "sentence",
    [
        'password authentication failed for user "app"',
        'role "app" does not exist',
        'database "jobs" does not exist',
        'role "app" is not permitted to log in',
        'no pg_hba.conf entry for host "10.0.0.1", user "app", database "jobs", no encryption',
    ],
)
def test_a_refused_connection_is_named_in_the_servers_words(sentence: str) -> None:
    exc = psycopg.OperationalError(PREFIX + sentence)
    assert refusal(exc) == sentence


def test_the_cause_of_forklifts_error_counts_and_a_sqlstate_is_named() -> None:
    try:
        try:
            raise psycopg.errors.InvalidPassword('password authentication failed for user "a"')
        except psycopg.Error as cause:
            raise DatabaseError("cannot connect to PostgreSQL") from cause
    except DatabaseError as exc:
        assert refusal(exc) == 'password authentication failed for user "a" (SQLSTATE 28P01)'


@pytest.mark.parametrize(
    "exc",
    [
        psycopg.OperationalError(PREFIX.replace("FATAL:  ", "") + "Connection refused"),
        psycopg.OperationalError(PREFIX + "the database system is starting up"),
        psycopg.OperationalError(PREFIX + "sorry, too many clients already"),
        psycopg.errors.UndefinedTable('relation "jobs" does not exist'),
        DatabaseError("no cause"),
    ],
)
def test_an_outage_or_a_missing_table_is_no_refusal(exc: Exception) -> None:
    assert refusal(exc) is None
