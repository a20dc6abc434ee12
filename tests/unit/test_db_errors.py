"""The store's error boundary keeps the psycopg error and classifies it: transient errors
are worth trying again, the others are answered again."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import errors as pg

from forklift.errors import DatabaseError, transient_state
from forklift.store._boundary import translated
from forklift.workers.context import storable


def raised(exc: BaseException) -> DatabaseError:
    with pytest.raises(DatabaseError) as caught, translated("completion failed"):
        raise exc
    return caught.value


@pytest.mark.parametrize(
    "exc",
    [
        pg.AdminShutdown("terminating connection due to administrator command"),
        pg.SerializationFailure("could not serialize access"),
        pg.DeadlockDetected("deadlock detected"),
        pg.TooManyConnections("sorry, too many clients already"),
        pg.QueryCanceled("canceling statement due to statement timeout"),
        pg.CannotConnectNow("the database system is starting up"),
        psycopg.OperationalError("server closed the connection unexpectedly"),
        psycopg.InterfaceError("the connection is closed"),
    ],
)
def test_an_error_trying_again_may_cure_is_transient(exc: psycopg.Error) -> None:
    error = raised(exc)
    assert error.transient and not error.row_dependent
    assert error.__cause__ is exc and error.sqlstate == exc.sqlstate


@pytest.mark.parametrize(
    ("exc", "rows"),
    [
        (pg.UntranslatableCharacter("unsupported Unicode escape sequence"), True),
        (pg.InvalidTextRepresentation("invalid input syntax for type json"), True),
        (pg.UniqueViolation("duplicate key value"), True),
        (psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"), True),
        (pg.InsufficientPrivilege("permission denied for table jobs"), False),
        (pg.SyntaxError("syntax error at or near"), False),
        (pg.UndefinedColumn("column does not exist"), False),
        (pg.InvalidPassword("password authentication failed"), False),
    ],
)
def test_bad_data_privileges_and_statements_are_permanent(exc: psycopg.Error, rows: bool) -> None:
    error = raised(exc)
    assert not error.transient
    assert error.row_dependent is rows
    assert error.__cause__ is exc and error.sqlstate == exc.sqlstate


def test_a_lone_surrogate_in_a_parameter_is_a_permanent_row_error() -> None:
    try:
        "\udcff".encode()
    except UnicodeEncodeError as exc:
        error = raised(exc)
    assert not error.transient and error.row_dependent and error.sqlstate is None


def test_sqlstate_classes() -> None:
    assert transient_state(None)  # no answer at all: the connection failed or was lost
    assert all(transient_state(s) for s in ("08006", "57P01", "57014", "53300", "40001"))
    assert not any(transient_state(s) for s in ("22P05", "23505", "42501", "42P01", "28P01"))


def test_a_plain_database_error_keeps_its_old_meaning() -> None:
    error = DatabaseError("claim failed: the database went away")
    assert error.transient and error.sqlstate is None and not error.row_dependent


def test_progress_text_is_made_storable() -> None:
    assert storable("step 3 of 9") == "step 3 of 9"
    assert storable("bad\x00") == "bad\\x00"
    assert storable("caf\u00e9 \udcff.txt") == "caf\u00e9 \\udcff.txt"
    assert storable("\ud83d\ude00").encode()  # a pair split in two: escaped, encodable


def test_ctx_progress_escapes_what_postgresql_cannot_store() -> None:
    from tests.unit.test_context import context

    ctx = context()
    ctx.progress(1, 2, "bad\x00")
    assert ctx.progress_now == (1, 2, "bad\\x00")
    ctx.progress(1.5, 2.0, "\udcff")
    assert ctx.progress_now == (1.5, 2.0, "\\udcff")

    class Count(int):  # not exactly an int: the checked path
        pass

    ctx = context()
    ctx.progress(Count(1), None, "a\x00b")
    assert ctx.progress_now is not None and ctx.progress_now[2] == "a\\x00b"
