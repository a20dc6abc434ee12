"""The supervisor stays prompt whatever the database does: a long VACUUM, a database that
never answers, one that refuses forklift for good (DESIGN invariants 12, 15, 25)."""

from __future__ import annotations

import os
import secrets
import signal
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import get, metrics_url, scalar, wait_state


@pytest.fixture
def slow_vacuum_dsn(dsn: str) -> Iterator[str]:
    """`dsn` as a role whose every VACUUM sleeps 0.1-0.4 s a page (its own settings, so
    nobody else's vacuum slows): a jobs table of ~50 pages takes half a minute."""
    role = f"forklift_slow_vacuum_{secrets.token_hex(3)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
        conn.execute(f"ALTER ROLE {role} SET vacuum_cost_delay = 100")
        conn.execute(f"ALTER ROLE {role} SET vacuum_cost_limit = 1")
    yield psycopg.conninfo.make_conninfo(dsn, user=role)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,)
        )
        wait_for(
            lambda: (
                not conn.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE usename = %s", (role,)
                ).fetchone()
            ),
            what=f"{role}'s sessions gone",
        )
        conn.execute(f"DROP ROLE {role}")


def vacuum_running(db: psycopg.Connection[Any], schema: str) -> float | None:
    """For how long the maintenance VACUUM of `schema`'s jobs has run, None if it is not."""
    return scalar(
        db,
        "SELECT max(extract(epoch FROM now() - query_start)) FROM pg_stat_activity "
        "WHERE query LIKE %s AND state = 'active'",
        f"VACUUM%{schema}%.jobs%",
    )


def test_a_long_vacuum_delays_no_death_charge_and_no_probe(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    env: dict[str, str],
    forklift_cli: Any,
    slow_vacuum_dsn: str,
) -> None:
    # Dead tuples past the vacuum threshold: the first maintenance round vacuums.
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task, args) "
        "SELECT 'elsewhere', 'noop', '{}'::jsonb FROM generate_series(1, 2500)"
    )
    db.execute(f"DELETE FROM {schema}.jobs")
    db.execute("SELECT pg_stat_force_next_flush()")
    env["FORKLIFT_DATABASE_URL"] = slow_vacuum_dsn
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(lambda: vacuum_running(db, schema), timeout=30, what="the maintenance VACUUM")
    app = forklift.App(dsn, schema=schema)
    try:
        job_id = app.enqueue("sleep", {"seconds": 60})
        wait_state(db, schema, job_id, "running", timeout=20)
        (child,) = sup.children()
        os.kill(child, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(
            lambda: scalar(db, f"SELECT attempts FROM {schema}.jobs WHERE id = %s", job_id) == 2,
            timeout=15,
            what="the killed child's job charged and run again",
        )
        charged_in = time.monotonic() - killed
        # /readyz through a VACUUM longer than the probes' staleness bound (10 s).
        not_ready = []
        while (took := vacuum_running(db, schema) or 0.0) < 14.0:
            status, body = get(url + "/readyz")
            if status != 200:
                not_ready.append(body.strip())
            assert took > 0.0, "the VACUUM ended before the test could watch /readyz"
            time.sleep(0.2)
        assert vacuum_running(db, schema), "the VACUUM must outlast the window watched"
        assert charged_in < 2.0, f"death charged {charged_in:.1f} s after the kill"
        assert not_ready == []
    finally:
        db.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE %s",
            (f"VACUUM%{schema}%.jobs%",),
        )
        app.close()
    sup.stop_cleanly(signal.SIGQUIT, timeout=30)
