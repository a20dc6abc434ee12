"""CLI conventions through the real `forklift` command: one-line errors, exit codes, hints."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

import forklift


def forklift_cmd(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forklift", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("forklift: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    return lines[0]


def test_version() -> None:
    result = forklift_cmd("--version")
    assert result.returncode == 0
    assert result.stdout.strip() == f"forklift {forklift.__version__}"


def test_an_app_that_does_not_import_is_one_line_and_exit_3(tmp_path: Path) -> None:
    (tmp_path / "broken.py").write_text("import forklift\n\nraise TypeError('half-written')\n")
    for command in (
        ["enqueue", "broken:app", "t"],
        ["worker", "broken:app"],
        ["run", "broken:app"],
    ):
        result = forklift_cmd(*command, cwd=tmp_path)
        assert result.returncode == 3, result.stderr
        line = one_error_line(result)
        assert "cannot import broken:app: TypeError: half-written" in line
        assert "broken.py:3" in line and "--debug" in line
    debug = forklift_cmd("run", "broken:app", "--debug", cwd=tmp_path)
    assert debug.returncode == 3 and "Traceback" in debug.stderr


def test_bad_args_are_usage_errors_exit_2() -> None:
    deep = "[" * 10_000 + "]" * 10_000
    result = forklift_cmd("enqueue", "tests.apps.basic:app", "noop", "--args", deep)
    assert result.returncode == 2
    assert "nested too deeply" in one_error_line(result)
    result = forklift_cmd("enqueue", "tests.apps.basic:app", "noop", "--args", "[1]")
    assert result.returncode == 2
    assert "JSON object of keyword arguments" in one_error_line(result)
    result = forklift_cmd("run", "tests.apps.basic:app", "--workers", "0")
    assert result.returncode == 2  # argparse's own usage error


def test_enqueue_refuses_a_task_the_app_does_not_know(
    env: dict[str, str], db: psycopg.Connection[object], schema: str
) -> None:
    result = forklift_cmd("enqueue", "tests.apps.basic:app", "nopp", env=env)
    assert result.returncode == 1
    assert "no task named 'nopp' in this app; did you mean 'noop'" in one_error_line(result)
    result = forklift_cmd("enqueue", "tests.apps.basic:app", "noop", "--key", "a\nb", env=env)
    assert result.returncode == 1
    assert "idempotency key name 'a\\nb' contains a control character" in one_error_line(result)
    row = db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone()
    assert row == (0,)  # nothing stored
    result = forklift_cmd("enqueue", "tests.apps.basic:app", "noop", env=env)
    assert result.returncode == 0 and result.stdout.strip().isdigit()


def test_an_unreachable_database_says_where_and_why_at_once(env: dict[str, str]) -> None:
    env["FORKLIFT_DATABASE_URL"] = "postgresql://someone:s3cr3t@127.0.0.1:1/nowhere"
    started = time.monotonic()
    result = forklift_cmd("enqueue", "tests.apps.basic:app", "noop", env=env)
    assert time.monotonic() - started < 10  # the connect timeout, not a pool's retries
    assert result.returncode == 1
    line = one_error_line(result)
    assert "cannot connect to PostgreSQL at someone@127.0.0.1:1/nowhere" in line
    assert "Connection refused" in line and "FORKLIFT_DATABASE_URL" in line
    assert "s3cr3t" not in line


def test_no_database_names_the_flag_and_the_variable_a_command_line_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The library's words (App(dsn=...)) are for library users; a command has --dsn.
    for name in ("FORKLIFT_DATABASE_URL", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    env = dict(os.environ)
    for command in (
        ["status"],
        ["ps"],
        ["queues", "pause", "emails"],
        ["jobs", "list"],
        ["enqueue", "tests.apps.basic:app", "noop"],
        ["run", "tests.apps.basic:app"],
    ):
        result = forklift_cmd(*command, env=env)
        assert result.returncode == 1, (command, result.stderr)
        assert one_error_line(result) == (
            "forklift: error: no database: pass --dsn or set FORKLIFT_DATABASE_URL "
            "(or DATABASE_URL); the development database is off: FORKLIFT_DEVDB=off"
        )
    with pytest.raises(forklift.ConfigError, match=r"pass App\(dsn=\.\.\.\)"):
        forklift.App(schema="t_cli").dsn  # noqa: B018
