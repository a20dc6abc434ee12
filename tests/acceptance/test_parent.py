"""The supervisor stays prompt whatever the database does: a long VACUUM, a database that
never answers, one that refuses forklift for good: it stays up, its loop and /healthz wait
on no database, and nothing slow shares a thread with what must be prompt."""

from __future__ import annotations

import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import calls_handler, wait_for
from tests.acceptance.conftest import get, metrics_url, scalar, wait_state
from tests.acceptance.proxy import Proxy
from tests.acceptance.test_http_slowloris import probe


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
    took = scalar(
        db,
        "SELECT max(extract(epoch FROM now() - query_start)) FROM pg_stat_activity "
        "WHERE query LIKE %s AND state = 'active'",
        f"VACUUM%{schema}%.jobs%",
    )
    return None if took is None else float(took)


def dead_tuples_to_vacuum(db: psycopg.Connection[Any], schema: str) -> None:
    """Dead tuples in `schema`'s jobs past the vacuum threshold: the first maintenance
    round vacuums. Not autovacuum (on in the embedded server): had it taken the table
    first, the maintenance VACUUM (SKIP_LOCKED) would skip it, and none would be seen."""
    db.execute(f"ALTER TABLE {schema}.jobs SET (autovacuum_enabled = false)")
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task, args) "
        "SELECT 'elsewhere', 'noop', '{}'::jsonb FROM generate_series(1, 2500)"
    )
    db.execute(f"DELETE FROM {schema}.jobs")
    db.execute("SELECT pg_stat_force_next_flush()")


def test_a_long_vacuum_delays_no_death_charge_and_no_probe(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    env: dict[str, str],
    forklift_cli: Any,
    slow_vacuum_dsn: str,
) -> None:
    dead_tuples_to_vacuum(db, schema)
    env["FORKLIFT_DATABASE_URL"] = slow_vacuum_dsn
    sup = forklift_cli("run", "tests.apps.prompt:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(lambda: vacuum_running(db, schema), timeout=30, what="the maintenance VACUUM")
    ticks = f"SELECT count(*) FROM {schema}.jobs WHERE task = 'tick'"
    app = forklift.App(dsn, schema=schema)
    try:
        job_id = app.enqueue("sleep", {"seconds": 60})
        wait_state(db, schema, job_id, "running", timeout=20)
        (child,) = sup.children()
        # Killed while its handler runs, not between its claim and its handler's start (a
        # job whose handler never ran is released uncharged).
        wait_for(lambda: calls_handler(child, job_id), what="the handler called")
        os.kill(child, signal.SIGKILL)
        killed = time.monotonic()
        charges = f"SELECT jsonb_array_length(errors) FROM {schema}.jobs WHERE id = %s"
        wait_for(  # the charge itself, not the re-run (a replacement's boot, a backoff)
            lambda: scalar(db, charges, job_id) >= 1,
            timeout=15,
            what="the killed child's job charged",
        )
        charged_in = time.monotonic() - killed
        # /readyz and a one-second schedule through a VACUUM longer than the probes'
        # staleness bound (10 s).
        not_ready = []
        watched, fired = time.monotonic(), scalar(db, ticks)
        while (took := vacuum_running(db, schema) or 0.0) < 14.0:
            status, body = get(url + "/readyz")
            if status != 200:
                not_ready.append(body.strip())
            assert took > 0.0, "the VACUUM ended before the test could watch /readyz"
            time.sleep(0.2)
        fired, watched = scalar(db, ticks) - fired, time.monotonic() - watched
        assert vacuum_running(db, schema), "the VACUUM must outlast the window watched"
        print(f"death charged in {charged_in:.2f} s; {fired} ticks in {watched:.1f} s")
        assert charged_in < 2.0, f"death charged {charged_in:.1f} s after the kill"
        assert not_ready == []
        assert fired >= watched - 3, f"{fired} fires of a one-second schedule in {watched:.0f} s"
    finally:
        db.execute(
            "SELECT pg_cancel_backend(pid) FROM pg_stat_activity WHERE query LIKE %s",
            (f"VACUUM%{schema}%.jobs%",),
        )
        app.close()
    sup.stop_cleanly(signal.SIGQUIT, timeout=30)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_healthz_answers_at_once_though_the_database_never_answers(
    dsn: str, env: dict[str, str], forklift_cli: Any
) -> None:
    proxy = Proxy.to(dsn)
    proxy.stall()  # connections are accepted and then nothing ever comes back
    port = free_port()
    env["FORKLIFT_DATABASE_URL"] = proxy.dsn_through(dsn)
    env["FORKLIFT_METRICS_ADDR"] = f"127.0.0.1:{port}"
    url = f"http://127.0.0.1:{port}"
    started = time.monotonic()
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    try:
        # From the line that says the port is bound (the app imported), every probe.
        wait_for(lambda: "supervisor.http" in sup.output(), timeout=20, what="the port bound")
        bound = time.monotonic() - started
        probes = []
        while time.monotonic() - started < bound + 8.0:
            probes.append(probe(url + "/healthz", timeout=1.0))
            time.sleep(0.1)
        print(f"bound {bound:.2f} s after the start; /healthz (status, s):", probes[:5])
        failed = [(status, round(took, 2)) for status, took in probes if status != 200]
        assert failed == [], f"{len(failed)} of {len(probes)} probes failed"
        # Python's start and the app's import, not a connect timeout (5 s) first.
        assert bound < 4.5, f"the metrics port bound {bound:.1f} s after the start"
        status, body = get(url + "/readyz")
        assert status == 503 and "database" in body, body
    finally:
        proxy.restore()
        proxy.cut()


@pytest.mark.parametrize(
    ("fault", "said"),
    [("database", r'database "\w+" does not exist'), ("role", r'role "\w+" does not exist')],
)
def test_a_database_that_refuses_forklift_at_boot_ends_it_with_one_line(
    dsn: str, env: dict[str, str], forklift_cli: Any, fault: str, said: str
) -> None:
    missing = f"forklift_missing_{secrets.token_hex(3)}"
    wrong = {"dbname": missing} if fault == "database" else {"user": missing}
    env["FORKLIFT_DATABASE_URL"] = psycopg.conninfo.make_conninfo(dsn, **wrong)
    env["FORKLIFT_REFUSED_GRACE"] = "2s"
    started = time.monotonic()
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    try:
        code = sup.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still retrying 20 s after the start:\n{sup.output()[-2000:]}")
    took = time.monotonic() - started
    print(f"exited {code} after {took:.1f} s")
    assert code == 1
    (line,) = [line for line in sup.output().splitlines() if line.startswith("forklift: error:")]
    assert re.search(said, line), line
    assert "refuses forklift" in line
    assert "Traceback" not in sup.output()


def test_a_database_that_refuses_forklift_after_boot_is_said_loudly_and_by_readyz(
    dsn: str, schema: str, env: dict[str, str], forklift_cli: Any
) -> None:
    role = f"forklift_refused_{secrets.token_hex(3)}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN SUPERUSER")
        env["FORKLIFT_DATABASE_URL"] = psycopg.conninfo.make_conninfo(dsn, user=role)
        env["FORKLIFT_REFUSED_GRACE"] = "1s"
        sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
        url = metrics_url(sup)
        try:
            wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready")
            admin.execute(f"ALTER ROLE {role} NOLOGIN")
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            answer = wait_for(
                lambda: (a := get(url + "/readyz"))[0] == 503 and "refuses" in a[1] and a,
                timeout=20,
                what="/readyz saying the database refuses forklift",
            )
            assert "not permitted to log in" in answer[1], answer
            wait_for(
                lambda: re.search(
                    r"ERROR \S+ supervisor\.database_refuses .*not permitted", sup.output()
                ),
                what="an error line naming the cause",
            )
            time.sleep(3)  # past the boot grace: after boot a refusal never ends it
            sup.check_alive()
            admin.execute(f"ALTER ROLE {role} LOGIN")
            wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready again")
            sup.stop_cleanly(signal.SIGQUIT, timeout=30)
        finally:
            sup.kill()
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (role,),
            )
            wait_for(
                lambda: (
                    not admin.execute(
                        "SELECT 1 FROM pg_stat_activity WHERE usename = %s", (role,)
                    ).fetchone()
                ),
                what=f"{role}'s sessions gone",
            )
            admin.execute(f"DROP ROLE {role}")
