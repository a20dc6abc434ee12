"""The development database: with no database URL, one embedded PostgreSQL per project,
shared by every process of the project, stopped when the last one exits (however it
exits), refused where a fleet would split; and the README's quickstart on it, as written."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from signal import SIGTERM

import pytest

from forklift import devdb
from forklift.testing import ForkliftProcess, wait_for

ROOT = Path(__file__).resolve().parents[2]
APP = """\
import forklift

app = forklift.App()


@app.task
def echo(ctx: forklift.JobContext, *, text: str) -> str:
    return text
"""


def project_env() -> dict[str, str]:
    """A user's shell in a project: no database URL, nothing that refuses a development
    database, forklift's venv first on PATH."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FORKLIFT_", "PYTEST_"))
        and k not in ("DATABASE_URL", "INVOCATION_ID", "KUBERNETES_SERVICE_HOST")
    }
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def forklift(
    cwd: Path, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forklift", *args],
        cwd=cwd,
        env=project_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=90,
    )


def user(project: Path) -> subprocess.Popen[str]:
    """A Python process of the project that uses its development database until its
    stdin closes; returned once it does (it printed the URL)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys, echoapp; print(echoapp.app.dsn, flush=True); "
         "sys.stdin.read()"],
        cwd=project, env=project_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    return proc


def gone(project: Path) -> bool:
    """Whether the project's server has stopped and exited (its files all written)."""
    return devdb.Server(devdb.Place(project / ".forklift")).postmaster(ready=False) is None


def server_pid(project: Path) -> int | None:
    """The project's server's pid while it runs (from its postmaster.pid), else None."""
    return devdb.Server(devdb.Place(project / ".forklift")).pid()


def new_project() -> Path:
    """A project directory outside pytest's base directory (each pytest session takes
    the others' search bit off that one, and the server's user must pass through)."""
    return Path(tempfile.mkdtemp(prefix="forklift-devdb-test-"))


@pytest.fixture
def project() -> Iterator[Path]:
    root = new_project()
    (root / "echoapp.py").write_text(APP)
    yield root
    devdb.stop(devdb.Place(root / ".forklift"))  # if a test failed midway
    shutil.rmtree(root, ignore_errors=True)


def test_commands_share_one_server_that_stops_when_its_last_user_is_killed(
    project: Path, tmp_path: Path
) -> None:
    supervisor = ForkliftProcess(
        ["run", "echoapp:app", "--workers", "1", "--metrics-addr", "127.0.0.1:0"],
        project_env(),
        tmp_path / "run.log",
        cwd=project,
    )
    try:
        wait_for(lambda: server_pid(project), timeout=60, what="the development database up")
        first = server_pid(project)
        # A second process of the project, with the supervisor running: the same server.
        result = forklift(project, "enqueue", "echoapp:app", "echo", "--args",
                          '{"text": "hi"}', "--wait", "30")  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == '"hi"'
        assert "development database ./.forklift (embedded PostgreSQL 18)" in result.stderr
        assert server_pid(project) == first, "the enqueue started a server of its own"
        # The supervisor and its workers die without a word: the server outlives no user.
        supervisor.kill_session()
        wait_for(lambda: gone(project), timeout=30, what="the server stopped")
    finally:
        supervisor.kill()
    # Data is kept across restarts: the job of the first run is still there.
    shown = forklift(project, "jobs", "list", "--state", "succeeded")
    assert shown.returncode == 0, shown.stderr
    assert "echo" in shown.stdout


def test_two_commands_racing_to_start_it_get_one_server(project: Path) -> None:
    racers = [user(project) for _ in range(3)]
    try:
        for racer in racers:
            assert racer.stdout is not None
            assert racer.stdout.readline().startswith("postgresql://"), "no URL"
        servers = {
            p.pid
            for p in _processes()
            if p.name == "postgres" and str(project / ".forklift" / "data") in p.cmdline
        }
        assert servers == {server_pid(project)}, "more than one server for one project"
    finally:
        ends = [racer.communicate(timeout=30) for racer in racers]  # EOF: each lets go
    for racer, (_out, err) in zip(racers, ends, strict=True):
        assert racer.returncode == 0, err
    wait_for(lambda: gone(project), timeout=30, what="the server stopped")


def test_a_process_that_starts_it_leaves_no_resource_warning(project: Path) -> None:
    # Users' test suites run with -W error: starting the server (and its reaper) must
    # leave nothing that warns when it is collected.
    code = "import gc, echoapp; echoapp.app.dsn; gc.collect()"
    done = subprocess.run(
        [sys.executable, "-X", "dev", "-W", "error", "-c", code],
        cwd=project, env=project_env(), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "Warning" not in done.stderr, done.stderr
    wait_for(lambda: gone(project), timeout=30, what="the server stopped")


def test_two_projects_get_two_servers(project: Path) -> None:
    other = new_project()
    (other / "echoapp.py").write_text(APP)
    users = [user(project), user(other)]
    try:
        urls = []
        for each in users:
            assert each.stdout is not None
            urls.append(each.stdout.readline().strip())
        assert urls[0] != urls[1]
        assert None not in (server_pid(project), server_pid(other))
        assert server_pid(project) != server_pid(other)
    finally:
        for each in users:
            each.communicate(timeout=30)
    wait_for(lambda: gone(other), timeout=30, what="the other's server stopped")
    shutil.rmtree(other, ignore_errors=True)


def test_devdb_stop_stops_it_and_the_next_command_starts_it_again(project: Path) -> None:
    assert forklift(project, "status").returncode == 0
    hold = user(project)
    try:
        assert hold.stdout is not None
        assert hold.stdout.readline().startswith("postgresql://"), "no URL"
        assert server_pid(project)
        stopped = forklift(project, "devdb", "stop")
        assert stopped.returncode == 0 and "stopped" in stopped.stdout, stopped.stderr
        assert server_pid(project) is None
        again = forklift(project, "devdb", "status")
        assert "stopped" in again.stdout
        assert forklift(project, "status").returncode == 0  # starts it again
    finally:
        hold.communicate(timeout=30)
    wait_for(lambda: gone(project), timeout=30, what="the server stopped")


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1", "in Kubernetes"),
        ("INVOCATION_ID", "5f3c", "under systemd"),
        ("FORKLIFT_ENV", "production", "FORKLIFT_ENV=production"),
        ("FORKLIFT_DEVDB", "off", "FORKLIFT_DEVDB=off"),
    ],
)
def test_it_is_refused_where_a_fleet_would_split(
    project: Path, variable: str, value: str, words: str
) -> None:
    env = {**project_env(), variable: value}
    result = forklift(project, "status", env=env)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("forklift: error: no database: pass --dsn or set FORKLIFT_DATABASE_URL")
    assert words in line
    assert not (project / ".forklift").exists()


def test_the_readme_quickstart_runs_as_written(tmp_path: Path) -> None:
    """README.md's quickstart blocks, in a new project: the module as written, the
    supervisor from the first terminal block, each line of the second run in turn."""
    readme = (ROOT / "README.md").read_text()
    module = _block(readme, "quickstart:mymodule.py", "python")
    first, second = _blocks(readme, "quickstart:terminal", "sh")
    project = new_project()
    (project / "mymodule.py").write_text(module)
    (run,) = _commands(first)
    assert run[:2] == ["forklift", "run"], run
    env = {**project_env(), "FORKLIFT_METRICS_ADDR": "127.0.0.1:0"}  # beside other tests
    supervisor = ForkliftProcess(run[1:], env, tmp_path / "run.log", cwd=project)
    try:
        outputs = []
        for command in _commands(second):
            assert command[0] == "forklift", command
            result = forklift(project, *command[1:])
            assert result.returncode == 0, (command, result.stderr, supervisor.output()[-2000:])
            outputs.append(result.stdout)
        expected = hashlib.sha256(b"hello").hexdigest()
        assert f'"{expected}"' in outputs[0].splitlines(), outputs[0]
        assert "default" in outputs[1]  # forklift status: the queue
        supervisor.signal(SIGTERM)
        assert supervisor.wait(timeout=30) == 0, supervisor.output()[-3000:]
    finally:
        supervisor.kill()
    wait_for(lambda: gone(project), timeout=30, what="the server stopped")
    shutil.rmtree(project, ignore_errors=True)


def _blocks(text: str, marker: str, language: str) -> list[str]:
    pattern = rf"<!-- {re.escape(marker)} -->\s*```{language}\n(.*?)```"
    found = re.findall(pattern, text, re.DOTALL)
    assert found, f"README.md has no ```{language} block after <!-- {marker} -->"
    return found


def _block(text: str, marker: str, language: str) -> str:
    (block,) = _blocks(text, marker, language)
    return block


def _commands(block: str) -> list[list[str]]:
    """Each line of a shell block as words, its comment dropped."""
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


class _Process:
    def __init__(self, pid: int, name: str, cmdline: str) -> None:
        self.pid, self.name, self.cmdline = pid, name, cmdline


def _processes() -> list[_Process]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name = (entry / "comm").read_text().strip()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        found.append(_Process(int(entry.name), name, cmdline))
    return found
