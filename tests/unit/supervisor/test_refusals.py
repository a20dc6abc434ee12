"""The supervisor's boot check: a refusal gives up after its grace, an outage never does."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from forklift import _db
from forklift.supervisor.refusals import BootCheck, DatabaseRefused

REFUSED = psycopg.OperationalError('connection failed: FATAL:  role "app" does not exist')
AWAY = psycopg.OperationalError("connection failed: Connection refused")


class Database:
    def __init__(self) -> None:
        self.error: Exception | None = REFUSED
        self.now = 0.0

    @contextmanager
    def connection(self) -> Iterator[None]:
        if self.error is not None:
            raise self.error
        yield None


@pytest.fixture
def database(monkeypatch: pytest.MonkeyPatch) -> Database:
    monkeypatch.setenv(_db.SESSION_URL_ENV, "postgresql://direct/db")  # no pooler probe
    return Database()


def check(database: Database) -> BootCheck:
    return BootCheck(
        "postgresql://app@db/jobs", _db.Timeouts(), database.connection, 10.0,
        clock=lambda: database.now,
    )  # fmt: skip


def test_a_refusal_gives_up_once_it_lasted_the_grace(database: Database) -> None:
    boot = check(database)
    for database.now in (0.0, 5.0, 9.9):
        boot.run_once()
        assert boot.fatal is None
    database.now = 10.0
    boot.run_once()
    assert isinstance(boot.fatal, DatabaseRefused)
    assert 'role "app" does not exist' in str(boot.fatal)


def test_an_outage_between_refusals_starts_the_grace_again_and_is_never_fatal(
    database: Database,
) -> None:
    boot = check(database)
    boot.run_once()
    database.now, database.error = 8.0, AWAY
    boot.run_once()
    database.now, database.error = 12.0, REFUSED
    boot.run_once()
    assert boot.fatal is None  # refused for 0 s of this run
    database.error = AWAY
    for database.now in (30.0, 300.0):
        boot.run_once()
    assert boot.fatal is None


def test_once_the_database_answered_a_refusal_is_no_longer_the_boots_business(
    database: Database,
) -> None:
    boot = check(database)
    database.error = None
    boot.run_once()
    assert boot.answered
    database.error = REFUSED
    for database.now in (0.0, 60.0):
        boot.run_once()
    assert boot.fatal is None
