"""deploy/forklift.service: systemd-analyze verifies it, its stop timeout covers forklift's
shutdown budget, and its ExecStart, run with the environment systemd would give it,
tells READY=1, serves /readyz and stops within TimeoutStopSec on its KillSignal."""

from __future__ import annotations

import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.cli.errors import Exit
from forklift.testing import child_pids, process_title, wait_for
from tests.acceptance.conftest import get, scalar, wait_state
from tests.deploy.support import DEPLOY, ROOT, run_config, running
from tests.deploy.systemd_unit import BINARY, NotifySocket, Unit, systemd_environment
from tests.tools import tool

UNIT = Unit.read(DEPLOY / "forklift.service")

HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "CapabilityBoundingSet": "",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",  # sd_notify, PostgreSQL, /metrics
}


def test_the_unit_runs_forklift_as_a_notify_service_that_systemd_stops_gently() -> None:
    assert UNIT.get("Type") == "notify"
    assert UNIT.get("KillSignal") == "SIGTERM"
    assert UNIT.get("KillMode") == "mixed"  # TERM to the supervisor; KILL to all at the end
    assert UNIT.get("Restart") == "on-failure"
    assert int(UNIT.get("StartLimitBurst", "Unit")) > 0
    assert UNIT.seconds("StartLimitIntervalSec", "Unit") > 0
    assert UNIT.seconds("WatchdogSec") > 0
    assert UNIT.get("User") not in ("", "root")
    assert not UNIT.get("EnvironmentFile").startswith("-"), "a missing DSN file must fail"
    assert UNIT.get("MemoryMax")
    assert UNIT.get("OOMPolicy") == "continue"  # an OOM-killed worker is forklift's to replace
    assert {k: UNIT.get(k) for k in HARDENING} == HARDENING
    prevent = {int(code) for code in UNIT.get("RestartPreventExitStatus").split()}
    assert prevent == {Exit.USAGE, Exit.APP_IMPORT}


def test_timeout_stop_sec_exceeds_the_shutdown_budget_of_its_exec_start() -> None:
    [(_, argv)] = UNIT.commands("ExecStart")
    config = run_config(argv[1:])
    assert UNIT.seconds("TimeoutStopSec") > config.shutdown_budget
    # The supervisor loop pings the watchdog every WatchdogSec / 2, from a loop that
    # ticks many times a second: a wedged loop, not a slow one, is what trips it.
    assert UNIT.seconds("WatchdogSec") >= 10


def _verify(analyze: str, unit: Path) -> tuple[int, list[str]]:
    result = subprocess.run(
        [analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    return result.returncode, (result.stdout + result.stderr).splitlines()


def test_systemd_analyze_verify_finds_nothing_but_the_paths_to_adjust(tmp_path: Path) -> None:
    analyze = tool("systemd-analyze", install="apt-get install systemd")
    env_file = tmp_path / "env"
    env_file.write_text("FORKLIFT_DATABASE_URL=postgresql://forklift@db/app\n")
    here = tmp_path / "here" / "forklift.service"
    here.parent.mkdir()
    here.write_text(UNIT.here(env_file=env_file))
    assert _verify(analyze, here) == (0, [])
    # The file as shipped: only the binary (and, on some systemd versions, the user) it
    # names are missing here; any other complaint fails.
    shipped = tmp_path / "shipped" / "forklift.service"
    shipped.parent.mkdir()
    shipped.write_text(UNIT.text)
    expected = re.compile(rf"{re.escape(BINARY)} is not executable|user.*forklift", re.I)
    _, complaints = _verify(analyze, shipped)
    assert [line for line in complaints if not expected.search(line)] == []


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    sock = NotifySocket(tmp_path / "notify.sock")
    yield sock
    sock.close()


@pytest.fixture
def unit_here(dsn: str, schema: str, tmp_path: Path) -> Unit:
    """The unit pointed at this machine, its EnvironmentFile naming the test's schema."""
    env_file = tmp_path / "forklift.env"
    env_file.write_text(
        f"FORKLIFT_DATABASE_URL={dsn}\nFORKLIFT_SCHEMA={schema}\n"
        "FORKLIFT_METRICS_ADDR=127.0.0.1:0\n"  # a free port: tests run side by side
    )
    env_file.chmod(0o600)
    path = tmp_path / "forklift.service"
    path.write_text(UNIT.here(env_file=env_file))
    return Unit.read(path)


def _exec_start(unit: Unit, notify: NotifySocket) -> tuple[list[str], dict[str, str], float]:
    """Run the ExecStartPre lines as systemd would; ExecStart's argv, environment and budget."""
    env = systemd_environment(unit, Path(unit.get("EnvironmentFile")), notify.path)
    for ignore, argv in unit.commands("ExecStartPre"):
        pre = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert ignore or pre.returncode == 0, pre.stderr
    [(_, argv)] = unit.commands("ExecStart")
    return argv, env, run_config(argv[1:], env).shutdown_budget


def _job_running(dsn: str, schema: str, db: psycopg.Connection[Any], supervisor: int) -> int:
    """A one-second job whose handler has begun (a child's title names it; claimed is
    not enough: a stop releases a job claimed but not started): a stop must let it
    finish within --grace."""
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 1.0})
    app.close()
    wait_state(db, schema, job_id, "running")
    wait_for(
        lambda: any(
            (process_title(pid) or "").endswith(f"running sleep#{job_id}")
            for pid in child_pids(supervisor)
        ),
        what=f"sleep#{job_id} started in a child",
    )
    return job_id


def _succeeded(db: psycopg.Connection[Any], schema: str, job_id: int) -> bool:
    """Finished within --grace: the stop let it end instead of releasing it."""
    return bool(scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "succeeded")


def test_exec_start_becomes_ready_and_stops_within_timeout_stop_sec(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    unit_here: Unit,
    notify: NotifySocket,
    tmp_path: Path,
) -> None:
    if Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is PID 1 here: test_exec_start_in_a_transient_unit runs it")
    argv, env, budget = _exec_start(unit_here, notify)
    log = tmp_path / "journal.log"
    with running(argv, env, log) as proc:
        ready = wait_for(lambda: notify.received("READY"), timeout=30, what="READY=1")
        assert ready["MAINPID"] == str(proc.pid)
        assert notify.received("WATCHDOG") is not None  # the first ping comes at once
        addr = wait_for(lambda: re.search(r"supervisor\.http addr=([\d.]+:\d+)", log.read_text()))
        wait_for(lambda: get(f"http://{addr[1]}/readyz")[0] == 200, what="/readyz 200")
        job_id = _job_running(dsn, schema, db, proc.pid)
        stopped = _stop(proc, getattr(signal, unit_here.get("KillSignal")), unit_here)
    assert proc.returncode == 0, log.read_text()[-3000:]
    assert notify.received("STOPPING") is not None
    assert stopped <= budget, f"stopped in {stopped:.1f} s, budget {budget:.1f} s"
    assert _succeeded(db, schema, job_id)


def _stop(proc: subprocess.Popen[bytes], signum: int, unit: Unit) -> float:
    """Send systemd's KillSignal to the main process; seconds until it exited."""
    started = time.monotonic()
    proc.send_signal(signum)
    try:
        proc.wait(timeout=unit.seconds("TimeoutStopSec"))
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running {unit.get('TimeoutStopSec')} s after {signum}")
    return time.monotonic() - started


# Exec settings a transient unit does not take as --property; ExecStartPre runs first.
NOT_TRANSIENT = {"ExecStart", "ExecStartPre", "ExecReload"}


def _active_state(systemctl: str, name: str) -> str:
    show = [systemctl, "show", "--property=ActiveState", "--value", name]
    return subprocess.run(show, capture_output=True, text=True, timeout=10).stdout.strip()


def test_exec_start_in_a_transient_unit(
    dsn: str, schema: str, db: psycopg.Connection[Any], unit_here: Unit, notify: NotifySocket
) -> None:
    if not Path("/run/systemd/system").is_dir():
        pytest.skip("systemd is not PID 1 here: the ExecStart line runs directly instead")
    run = tool("systemd-run", install="apt-get install systemd")
    systemctl = tool("systemctl", install="apt-get install systemd")
    argv, _, budget = _exec_start(unit_here, notify)
    name = f"forklift-test-{schema}.service"
    service = unit_here.sections["Service"]
    props = [f"--property={k}={v}" for k, v in service if k not in NOT_TRANSIENT]
    subprocess.run([run, f"--unit={name}", *props, "--", *argv], check=True, timeout=30)
    try:
        wait_for(lambda: _active_state(systemctl, name) == "active", timeout=30, what="READY=1")
        show = [systemctl, "show", "--property=MainPID", "--value", name]
        main_pid = int(subprocess.run(show, capture_output=True, text=True, timeout=10).stdout)
        job_id = _job_running(dsn, schema, db, main_pid)
        started = time.monotonic()
        subprocess.run([systemctl, "stop", name], check=True, timeout=budget + 30)
        stopped = time.monotonic() - started
        assert _active_state(systemctl, name) != "failed"
    finally:
        subprocess.run([systemctl, "stop", name], capture_output=True, timeout=budget + 30)
        subprocess.run([systemctl, "reset-failed", name], capture_output=True, timeout=10)
    assert stopped <= budget, f"stopped in {stopped:.1f} s, budget {budget:.1f} s"
    assert _succeeded(db, schema, job_id)
