"""Shared fixtures: a real PostgreSQL, one fresh schema per test, helpers to wait on conditions."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.embedded import EmbeddedPostgres

LOCAL = "postgresql://root@127.0.0.1:5432/test"

# No test starts a development database (forklift.devdb) in the repository by leaving out
# a database URL: those that mean to use one (tests/acceptance/test_devdb.py) say so.
os.environ["FORKLIFT_DEVDB"] = "off"


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=2) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError:
        return False
    return True


@pytest.fixture(scope="session")
def dsn() -> Iterator[str]:
    """The database every test works in (its own schemas in it), chosen once:

    FORKLIFT_TEST_DATABASE_URL when set; else the local server at 127.0.0.1:5432 when it
    answers; else an embedded PostgreSQL started for this run (FORKLIFT_TEST_EMBEDDED=1
    forces that one). A named database that does not answer is a failure, never a skip.
    """
    named = os.environ.get("FORKLIFT_TEST_DATABASE_URL")
    if named:
        if not _answers(named):
            pytest.fail(f"PostgreSQL is not reachable at FORKLIFT_TEST_DATABASE_URL={named}")
        yield named
    elif os.environ.get("FORKLIFT_TEST_EMBEDDED") != "1" and _answers(LOCAL):
        yield LOCAL
    else:
        with EmbeddedPostgres(prefix="forklift-test-pg-") as server:
            yield server.dsn


@pytest.fixture
def db(dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """An autocommit connection for the test's own checks."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        yield conn


@pytest.fixture
def schema(dsn: str) -> Iterator[str]:
    """A fresh, migrated forklift schema, dropped after the test."""
    name = f"t_{secrets.token_hex(5)}"
    forklift.App(dsn, schema=name).migrate()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name}.effects (job_id bigint, key text, n integer)")
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture
def env(dsn: str, schema: str) -> dict[str, str]:
    """Environment for a forklift subprocess pointed at this test's schema."""
    e = dict(os.environ)
    e.update(
        FORKLIFT_DATABASE_URL=dsn,
        FORKLIFT_SCHEMA=schema,
        FORKLIFT_METRICS_ADDR="127.0.0.1:0",  # a free port: tests never fight over 9367
        FORKLIFT_LOG_FORMAT="text",  # tests grep event lines; JSON has its own tests
        PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(__file__)), e.get("PYTHONPATH", "")]
        ),
    )
    return e
