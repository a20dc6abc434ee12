"""Shared fixtures: a real PostgreSQL, one fresh schema per test, helpers to wait on conditions."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift

DSN = os.environ.get("FORKLIFT_TEST_DATABASE_URL", "postgresql://root@127.0.0.1:5432/test")


@pytest.fixture(scope="session")
def dsn() -> str:
    # CI has PostgreSQL: an unreachable database is a failure, never a skip.
    try:
        with psycopg.connect(DSN, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL is not reachable at {DSN}: {exc}")
    return DSN


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
        FORKLIFT_METRICS_ADDR="127.0.0.1:0",  # a free port: tests never fight over 9090
        FORKLIFT_LOG_FORMAT="text",  # tests grep event lines; JSON has its own tests
        PYTHONPATH=os.pathsep.join(
            [os.path.dirname(os.path.dirname(__file__)), e.get("PYTHONPATH", "")]
        ),
    )
    return e
