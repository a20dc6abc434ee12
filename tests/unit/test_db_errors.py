"""The store's error boundary keeps the psycopg error and classifies it: the database
unavailable (transient) is worth trying again; a refusal is answered again, so reported."""

from __future__ import annotations

from collections.abc import Callable

import psycopg
import pytest
from psycopg import errors as pg

from forklift import _db, _waiting
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


UNAVAILABLE = [
    pg.AdminShutdown("terminating connection due to administrator command"),
    pg.ConnectionFailure("connection failure"),
    pg.SerializationFailure("could not serialize access"),
    pg.DeadlockDetected("deadlock detected"),
    pg.TooManyConnections("sorry, too many clients already"),
    pg.QueryCanceled("canceling statement due to statement timeout"),
    pg.CannotConnectNow("the database system is starting up"),
    pg.DiskFull("could not extend file: No space left on device"),
    psycopg.OperationalError("server closed the connection unexpectedly"),
    psycopg.InterfaceError("the connection is closed"),
    ConnectionResetError("connection reset by peer"),
]
REFUSED = [
    pg.CheckViolation("new row violates check constraint"),
    pg.UniqueViolation("duplicate key value"),
    pg.InvalidTextRepresentation("invalid input syntax for type integer"),
    pg.DivisionByZero("division by zero"),
    pg.InsufficientPrivilege("permission denied for table jobs"),
    pg.InvalidPassword("password authentication failed"),
    pg.InvalidAuthorizationSpecification("role is not permitted to log in"),
    pg.SyntaxError("syntax error at or near"),
    pg.UndefinedColumn("column does not exist"),
    pg.FeatureNotSupported("not supported"),
    psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes"),
    psycopg.ProgrammingError("the query has 2 placeholders but 1 parameters were passed"),
]


@pytest.mark.parametrize("exc", UNAVAILABLE, ids=lambda e: type(e).__name__)
def test_the_database_unavailable_is_transient(exc: BaseException) -> None:
    assert _db.transient(exc)
    if isinstance(exc, psycopg.Error):
        error = raised(exc)
        assert _db.transient(error) and error.cause_class is type(exc)


@pytest.mark.parametrize("exc", REFUSED, ids=lambda e: type(e).__name__)
def test_a_refusal_is_not_transient(exc: psycopg.Error) -> None:
    assert not _db.transient(exc)
    error = raised(exc)
    assert not _db.transient(error) and error.cause_class is type(exc)
    assert error.__cause__ is exc and error.sqlstate == exc.sqlstate


def test_no_database_error_is_transient() -> None:
    assert not _db.transient(ValueError("a bug"))
    assert not _db.transient(KeyError("k"))


def test_a_database_error_made_from_its_cause_keeps_it_unraised() -> None:
    cause = pg.CheckViolation("new row violates check constraint")
    error = _db.database_error("insert failed", cause)
    assert error.__cause__ is cause and error.cause_class is pg.CheckViolation
    assert error.sqlstate == "23514" and error.row_dependent and not error.transient
    assert DatabaseError("no cause").cause_class is None


def reads(exc: BaseException) -> tuple[list[object], Callable[[], str | None]]:
    """A check that reads nothing, then fails twice with `exc`, then answers."""
    answers: list[object] = [None, raised(exc), raised(exc), "done"]

    def check() -> str | None:
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer  # type: ignore[return-value]

    return answers, check


def test_a_wait_raises_a_refusal_at_once() -> None:
    ends = _waiting.Ends("postgresql://nowhere/x", deaf=True)  # no listener: a timer
    answers, check = reads(REFUSED[0])
    with pytest.raises(DatabaseError) as caught:
        _waiting.wait_for_end(ends, "s", "j1", check, timeout=30.0)
    assert caught.value.cause_class is pg.CheckViolation
    assert len(answers) == 2  # read twice: never again after the refusal


def test_a_wait_reads_again_while_the_database_is_unavailable() -> None:
    ends = _waiting.Ends("postgresql://nowhere/x", deaf=True)
    answers, check = reads(UNAVAILABLE[0])
    assert _waiting.wait_for_end(ends, "s", "j1", check, timeout=30.0) == "done"
    assert not answers


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
