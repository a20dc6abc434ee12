"""What an operator sees: /metrics, /healthz, /readyz, the process registry, logs, systemd."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import WaitTimedOut, calls_handler, wait_for
from tests.acceptance.conftest import (
    cli,
    cli_json,
    get,
    metrics_url,
    scalar,
    still_serves,
    wait_state,
)
from tests.acceptance.proxy import Proxy


def samples(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def test_metrics_sum_every_child_and_survive_crashes_and_recycling(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    n = 300
    app.enqueue_many([("noop", {}) for _ in range(n)])
    sup = forklift_cli(
        "run", "tests.apps.basic:app", "--workers", "2", "--max-jobs-per-child", "40"
    )
    url = metrics_url(sup)
    wait_for(
        lambda: samples(get(url + "/metrics")[1], "forklift_jobs_total", outcome="succeeded") == n,
        timeout=30,
        what=f"{n} succeeded",
    )
    body = get(url + "/metrics")[1]
    assert samples(body, "forklift_job_duration_seconds_count", task="noop") == n
    assert samples(body, "forklift_job_wait_seconds_count", queue="default") == n
    # 300 jobs at 40 per child: children were recycled along the way.
    recycled = samples(body, "forklift_worker_restarts_total", reason="recycle")
    assert recycled >= 5
    # A crash: counters stay, the restart counter rises, the crash is counted.
    victim_job = app.enqueue("sleep", {"seconds": 30})
    wait_state(db, schema, victim_job, "running")
    owner = scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", victim_job)
    victim = int(owner.split(":")[1])
    # Killed while its handler runs: one killed before its handler's start is no crash.
    wait_for(lambda: calls_handler(victim, victim_job), what="the handler called")
    os.kill(victim, signal.SIGKILL)
    wait_for(
        lambda: (
            samples(get(url + "/metrics")[1], "forklift_worker_restarts_total", reason="crash") == 1
        ),
        what="crash restart counted",
    )
    # The crash's charge is counted once the database thread has recorded it on the job.
    wait_for(
        lambda: samples(get(url + "/metrics")[1], "forklift_jobs_total", outcome="crashed") == 1,
        what="the crash counted",
    )
    body = get(url + "/metrics")[1]
    assert samples(body, "forklift_jobs_total", outcome="succeeded") == n
    assert samples(body, "forklift_jobs_total", outcome="crashed", task="sleep") == 1
    wait_for(
        lambda: samples(get(url + "/metrics")[1], "forklift_workers") == 2,
        what="the replacement counted among the workers",
    )

    def open_jobs() -> float:  # the queue gauges are the probes' cached counts
        body = get(url + "/metrics")[1]
        return samples(body, "forklift_queue_depth", queue="default", state="running") + samples(
            body, "forklift_queue_depth", queue="default", state="ready"
        )

    wait_for(lambda: open_jobs() >= 1, what="the charged job in the queue gauges")
    sup.stop_cleanly(timeout=40)
    app.close()


def test_many_recycles_pile_nothing_up(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2", "--max-jobs-per-child", "1")
    url = metrics_url(sup)

    def footprint() -> tuple[int, int]:
        fds = len(os.listdir(f"/proc/{sup.pid}/fd"))
        rss = int(Path(f"/proc/{sup.pid}/statm").read_text().split()[1])
        return fds, rss

    app.enqueue_many([("noop", {}) for _ in range(20)])
    wait_for(
        lambda: samples(get(url + "/metrics")[1], "forklift_worker_restarts_total") >= 20,
        timeout=60,
        what="warm-up recycles",
    )
    before = footprint()
    app.enqueue_many([("noop", {}) for _ in range(200)])
    wait_for(
        lambda: samples(get(url + "/metrics")[1], "forklift_worker_restarts_total") >= 220,
        timeout=120,
        interval=0.2,
        what="200 more recycles",
    )
    # A child being replaced holds a few of its supervisor's descriptors until it is up
    # (its pipe, its memfd): the count is read once that has passed. A leak never does.
    with contextlib.suppress(WaitTimedOut):  # the assertion below says what stayed
        wait_for(lambda: footprint()[0] <= before[0] + 2, timeout=15)
    after = footprint()
    assert after[0] <= before[0] + 2, (before, after)  # no leaked pipes or sockets
    assert after[1] - before[1] < 2560, (before, after)  # < 10 MiB (4 KiB pages)
    body = get(url + "/metrics")[1]
    assert samples(body, "forklift_jobs_total", outcome="succeeded") == 220
    sup.stop_cleanly(timeout=30)
    app.close()


def test_a_child_writing_garbage_to_its_pipe_is_counted_and_harms_nothing(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("scribble")
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_state(db, schema, job_id, "succeeded", timeout=20)
    still_serves(app, db, schema, sup)
    assert "child.malformed_report" in sup.output()
    assert samples(get(url + "/metrics")[1], "forklift_malformed_reports_total") >= 3
    assert get(url + "/readyz")[0] == 200
    sup.stop_cleanly(timeout=15)
    app.close()


def test_readyz_goes_503_on_sigterm_before_anything_else(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 3})
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "10")
    url = metrics_url(sup)
    wait_for(lambda: get(url + "/readyz")[0] == 200, what="ready")
    assert get(url + "/healthz")[0] == 200
    sup.wait_started("sleep", job_id)  # begun, so the graceful stop lets it finish
    sup.signal(signal.SIGTERM)
    _status, body = wait_for(
        lambda: (r := get(url + "/readyz"))[0] == 503 and r, what="not ready while draining"
    )
    assert "shutting down" in body
    assert get(url + "/healthz")[0] == 200  # alive, just draining
    assert sup.wait(timeout=20) == 0
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "succeeded"
    app.close()


def test_database_outage_keeps_the_supervisor_up_not_ready_then_recovers(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    forklift_cli: Any,
    env: dict[str, str],
) -> None:
    proxy = Proxy.to(dsn)
    env["FORKLIFT_DATABASE_URL"] = proxy.dsn_through(dsn)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(lambda: get(url + "/readyz")[0] == 200, what="ready")
    proxy.cut()
    _status, body = wait_for(
        lambda: (r := get(url + "/readyz"))[0] == 503 and r, what="not ready without a database"
    )
    assert "database unreachable" in body
    assert get(url + "/healthz")[0] == 200
    app = forklift.App(dsn, schema=schema)  # straight to the database, not via the proxy
    job_id = app.enqueue("noop")
    proxy.restore()
    wait_for(lambda: get(url + "/readyz")[0] == 200, timeout=20, what="ready again")
    wait_state(db, schema, job_id, "succeeded", timeout=20)
    assert sup.popen.poll() is None
    sup.stop_cleanly(timeout=30)
    proxy.cut()
    app.close()


def test_ps_lists_supervisors_of_other_processes(
    dsn: str, schema: str, forklift_cli: Any, env: dict[str, str]
) -> None:
    first = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    second = forklift_cli("run", "tests.apps.basic:app", "--workers", "2", "--queues", "other")

    def ps() -> list[dict[str, Any]]:
        out = subprocess.run(
            [sys.executable, "-m", "forklift", "ps", "--json"],
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return list(json.loads(out.stdout))

    rows = wait_for(
        lambda: (r := ps()) and len(r) == 5 and r,
        timeout=20,
        what="two supervisors and three workers registered",
    )
    sups = {r["pid"]: r for r in rows if r["kind"] == "supervisor"}
    assert set(sups) == {first.pid, second.pid}
    workers = [r for r in rows if r["kind"] == "worker"]
    assert sorted(r["pid"] for r in workers) == sorted(first.children() + second.children())
    assert all(
        r["supervisor_id"] == sups[second.pid]["id"] for r in workers if r["queues"] == ["other"]
    )
    text = subprocess.run(
        [sys.executable, "-m", "forklift", "ps"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    assert text.splitlines()[0].split()[:3] == ["host", "pid", "kind"]
    second.stop_cleanly(timeout=20)
    wait_for(lambda: len(ps()) == 2, what="the stopped supervisor deregistered")
    first.stop_cleanly(timeout=20)


def test_ps_shows_a_job_as_task_and_id_the_moment_it_runs(
    dsn: str, schema: str, forklift_cli: Any, env: dict[str, str]
) -> None:
    # The registry's heartbeat (every 5 s) lags; ps reads what runs from the jobs, as top.
    app = forklift.App(dsn, schema=schema)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "0.5")
    wait_for(lambda: len(cli_json(env, "ps")) == 2, what="the supervisor and its worker")
    job_id = app.enqueue("sleep", {"seconds": 60})
    sup.wait_started("sleep", job_id)
    [worker] = [r for r in cli_json(env, "ps") if r["kind"] == "worker"]
    assert worker["jobs"] == [{"id": job_id, "task": "sleep", "queue": "default"}]
    assert worker["current_job"] == job_id and worker["registered"] is True
    described = cli({}, "ps", "--help").stdout
    assert [k for k in worker if k not in described] == []
    [row] = [line for line in cli(env, "ps").stdout.splitlines() if line.split()[2] == "worker"]
    assert row.split()[1] == str(sup.children()[0]) and f"sleep#{job_id}" in row.split()
    sup.stop_cleanly(timeout=30)
    app.close()


def test_ps_lists_the_owner_of_a_running_job_that_is_not_registered(
    dsn: str, schema: str, db: psycopg.Connection[Any], env: dict[str, str]
) -> None:
    # A worker forked a moment ago runs jobs before its supervisor's next heartbeat
    # registers it; its jobs are shown all the same, on a line of its own.
    app = forklift.App(dsn, schema=schema)
    registered, unregistered = "h1:10:aa@9.bb", "h1:11:cc@9.bb"
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, supervisor_id, queues)"
        " VALUES (%s, 'worker', 'h1', 10, 'h1:9:bb', '{default}')",
        (registered,),
    )
    ids = [app.enqueue("noop"), app.enqueue("sleep", {"seconds": 1}), app.enqueue("noop")]
    for job_id, owner in zip(ids, (registered, unregistered, registered), strict=True):
        db.execute(
            f"UPDATE {schema}.jobs SET state = 'running', lease_owner = %s, attempts = 1,"
            " started_at = now(), lease_until = now() + interval '30 seconds' WHERE id = %s",
            (owner, job_id),
        )
    rows = {r["id"]: r for r in cli_json(env, "ps")}
    assert [j["id"] for j in rows[registered]["jobs"]] == [ids[0], ids[2]]
    assert rows[unregistered]["registered"] is False and rows[unregistered]["pid"] == 11
    assert rows[unregistered]["jobs"] == [{"id": ids[1], "task": "sleep", "queue": "default"}]
    lines = cli(env, "ps").stdout.splitlines()
    assert f"noop#{ids[0]}, noop#{ids[2]}" in lines[1]
    assert lines[2].split() == [
        "h1", "11", "worker", "default", f"sleep#{ids[1]}", "-", "-", "not", "registered",
    ]  # fmt: skip
    app.close()


def test_a_vanished_supervisors_jobs_are_recovered_by_another(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    # A host that dies takes its supervisor and workers with it: simulate it with
    # registry rows whose heartbeat stopped and a job leased to one of its workers.
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("noop")
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, supervisor_id, heartbeat_at)"
        " VALUES ('gone:1:a', 'supervisor', 'gone', 1, NULL, now() - interval '1 minute'),"
        " ('gone:2:b', 'worker', 'gone', 2, 'gone:1:a', now() - interval '1 minute')"
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', attempts = 1, lease_owner = 'gone:2:b',"
        " lease_until = now() + interval '1 hour' WHERE id = %s",
        (job_id,),
    )
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    wait_state(db, schema, job_id, "succeeded", timeout=20)
    first_error = scalar(db, f"SELECT errors->0->>'error' FROM {schema}.jobs WHERE id = %s", job_id)
    assert first_error.startswith("WorkerLost")
    assert scalar(db, f"SELECT count(*) FROM {schema}.processes WHERE host = 'gone'") == 0
    sup.stop_cleanly(timeout=20)
    app.close()


def test_logs_are_json_events_and_never_show_the_password(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    forklift_cli: Any,
    env: dict[str, str],
) -> None:
    # Trust auth ignores the password, so this DSN works and carries a secret.
    info = psycopg.conninfo.conninfo_to_dict(dsn)
    secret_dsn = (
        f"postgresql://{info.get('user') or 'root'}:s3cr3t-pw@/{info['dbname']}"
        f"?host={info.get('host') or '127.0.0.1'}&port={info.get('port') or 5432}"
    )
    env["FORKLIFT_DATABASE_URL"] = secret_dsn
    env["FORKLIFT_LOG_FORMAT"] = "json"
    app = forklift.App(dsn, schema=schema)
    failing = app.enqueue("fail", {"message": f"cannot reach {secret_dsn}"}, max_attempts=1)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--log-level", "DEBUG")
    wait_state(db, schema, failing, "dead")
    sup.stop_cleanly(timeout=20)
    events = [json.loads(line) for line in sup.output().splitlines() if line.strip()]
    names = {e.get("event") for e in events}
    assert {
        "supervisor.started",
        "child.started",
        "worker.started",
        "job.claimed",
        "job.dead",
        "child.exited",
        "supervisor.stopped",
    } <= names
    dead = next(e for e in events if e.get("event") == "job.dead")
    assert dead["job"] == failing and dead["task"] == "fail" and dead["attempt"] == 1
    assert "s3cr3t-pw" not in sup.output()
    # A bad database with a password: the error names the problem, never the secret.
    bad = subprocess.run(
        [
            sys.executable,
            "-m",
            "forklift",
            "status",
            "--dsn",
            "postgresql://u:s3cr3t-pw@127.0.0.1:1/x",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert bad.returncode == 1
    assert "forklift: error:" in bad.stderr and "s3cr3t-pw" not in bad.stderr + bad.stdout
    app.close()


@pytest.fixture
def notify_socket(tmp_path: Path) -> Any:
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(0.1)
    yield sock, path
    sock.close()


def test_systemd_notify_ready_watchdog_and_stopping(
    forklift_cli: Any, env: dict[str, str], notify_socket: Any
) -> None:
    sock, path = notify_socket
    env["NOTIFY_SOCKET"] = str(path)
    env["WATCHDOG_USEC"] = "1000000"
    messages: list[str] = []

    def received(text: str) -> bool:
        try:
            messages.append(sock.recv(4096).decode())
        except TimeoutError:
            pass
        return any(text in m for m in messages)

    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2")
    wait_for(lambda: received("READY=1"), what="READY=1")
    assert len(sup.children()) == 2  # ready means the workers are up

    def pings() -> int:
        received("WATCHDOG=1")
        return sum("WATCHDOG=1" in m for m in messages)

    # WATCHDOG_USEC=1 s: a ping every half second from the main loop.
    wait_for(lambda: pings() >= 3, what="three watchdog pings")
    sup.signal(signal.SIGTERM)
    wait_for(lambda: received("STOPPING=1"), what="STOPPING=1")
    stopping = next(m for m in messages if "STOPPING=1" in m)
    assert "EXTEND_TIMEOUT_USEC=" in stopping
    assert sup.wait(timeout=20) == 0


def test_what_a_killed_worker_finished_is_still_counted(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """Workers SIGKILLed while they finish jobs by the hundred: once every job is done,
    the counters say what the database says (counts sent over the pipe alone would lose
    each killed worker's last half second of them for good)."""
    app = forklift.App(dsn, schema=schema)
    n = 6000
    app.enqueue_many([("noop", {}) for _ in range(n)])
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2")
    url = metrics_url(sup)

    def succeeded() -> int:
        return int(scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'"))

    def unfinished() -> int:
        return int(
            scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state IN ('ready', 'running')")
        )

    kills = 0
    deadline = time.monotonic() + 60
    while kills < 6 and succeeded() < n * 0.8 and time.monotonic() < deadline:
        if succeeded() > n * 0.1 * (kills + 1) and (children := sup.children()):
            os.kill(children[kills % len(children)], signal.SIGKILL)
            kills += 1
        time.sleep(0.02)  # a poll of the progress, bounded by the deadline
    assert kills >= 3, f"only {kills} kills before the jobs ran out"
    wait_for(lambda: unfinished() == 0, timeout=60, what="every job ended")

    def counted() -> float:
        return samples(get(url + "/metrics")[1], "forklift_jobs_total", outcome="succeeded")

    # Reports come twice a second: what the database shows is counted within a second.
    try:
        wait_for(lambda: counted() >= succeeded(), timeout=10, what="the counters caught up")
    except WaitTimedOut:
        body = get(url + "/metrics")[1]
        lines = [x for x in body.splitlines() if x.startswith("forklift_jobs_total")]
        raise AssertionError(f"{counted()} counted, {succeeded()} in the db: {lines}") from None
    assert counted() == succeeded() > n * 0.9
    sup.stop_cleanly(timeout=40)
    app.close()
