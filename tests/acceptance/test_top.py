"""`forklift top` in a real 80x24 terminal (tmux): it shows a running job, its progress
and its checkpoint, q quits it, Ctrl-C too, and the terminal is restored either way."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import wait_for
from tests.tools import tool


class Terminal:
    """A shell in an 80x24 tmux pane on a private tmux server."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        tmux = tool("tmux", install="apt-get install tmux; scripts/setup does")
        self.base = [tmux, "-L", name, "-f", "/dev/null"]
        keep = ("FORKLIFT_DATABASE_URL", "FORKLIFT_SCHEMA", "PYTHONPATH", "PATH")
        shell = ["env", *(f"{k}={env[k]}" for k in keep if k in env), "TERM=xterm-256color"]
        shell += ["bash", "--norc", "--noprofile"]
        command = [*self.base, "new-session", "-d", "-s", "t", "-x", "80", "-y", "24"]
        subprocess.run([*command, shlex.join(shell)], check=True, timeout=10)

    def type(self, *keys: str) -> None:
        subprocess.run([*self.base, "send-keys", "-t", "t", *keys], check=True, timeout=10)

    def screen(self) -> str:
        shot = subprocess.run(
            [*self.base, "capture-pane", "-p", "-t", "t"], capture_output=True, text=True
        )
        return shot.stdout

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def terminal(env: dict[str, str], schema: str) -> Iterator[Terminal]:
    term = Terminal(f"forklift-{schema}", env)
    yield term
    term.close()


def _terminal_settings(terminal: Terminal, out: Path) -> str:
    """`stty -a` as the shell sees it now (after top has gone)."""
    out.unlink(missing_ok=True)
    terminal.type(f"stty -a > {out}", "Enter")
    return str(wait_for(lambda: out.exists() and out.read_text(), what="stty output"))


def _row_shows(terminal: Terminal, job_id: int, pattern: str, what: str) -> None:
    """Until the running job's row on the screen matches `pattern`."""
    wait_for(
        lambda: any(
            f"sleep#{job_id}" in line and re.search(pattern, line.rstrip())
            for line in terminal.screen().splitlines()
        ),
        timeout=15,
        what=what,
    )


def _progress_and_checkpoint_shown(
    db: psycopg.Connection[Any], schema: str, job_id: int, terminal: Terminal
) -> None:
    """The progress a job reports shows on its row, and then its checkpoint's age (the
    handler reports and writes neither: both set here)."""
    db.execute(
        f"UPDATE {schema}.jobs SET progress = jsonb_build_object('done', 37, 'total', 100,"
        " 'message', %s::text, 'at', now()) WHERE id = %s",
        ("tiles\x1b[2J", job_id),
    )
    _row_shows(terminal, job_id, r"37% tiles$", "top showing the job's progress")
    db.execute(
        f"UPDATE {schema}.jobs SET checkpoint = %s::jsonb,"
        " checkpoint_at = now() - interval '12 seconds' WHERE id = %s",
        ('{"v": 1, "cursors": {"iterate": 41}}', job_id),
    )
    _row_shows(terminal, job_id, r" 37% ↻1\ds\b", "top marking the job's checkpoint")


def test_top_shows_a_running_job_in_80x24_and_q_or_ctrl_c_quit_it(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    forklift_cli: Any,
    terminal: Terminal,
    tmp_path: Path,
) -> None:
    app = forklift.App(dsn, schema=schema)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "0.5")
    job_id = app.enqueue("sleep", {"seconds": 60})
    sup.wait_started("sleep", job_id)
    before = _terminal_settings(terminal, tmp_path / "before")
    status = tmp_path / "status"
    top = f"{shlex.quote(sys.executable)} -m forklift top; echo $? > {status}"
    terminal.type(top, "Enter")
    screen = wait_for(
        lambda: (shown := terminal.screen()) and f"sleep#{job_id}" in shown and shown,
        timeout=15,
        what="top showing the running job",
    )
    lines = screen.rstrip("\n").splitlines()
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines)
    assert lines[0].startswith("forklift top ") and lines[0].rstrip().endswith("q quits")
    assert "Workers: 1 (1 busy) of 1 supervisor" in screen and "supervisors" not in screen
    [row] = [line for line in lines if f"sleep#{job_id}" in line]
    assert row.split()[1] == str(sup.children()[0])  # the worker's pid, on the job's row
    _progress_and_checkpoint_shown(db, schema, job_id, terminal)
    terminal.type("q")
    wait_for(lambda: status.exists() and status.read_text().strip() == "0", what="q quits, 0")
    assert _terminal_settings(terminal, tmp_path / "after_q") == before
    # Ctrl-C quits too (exit 130, as documented), and restores the terminal as well.
    status.unlink()
    terminal.type(top, "Enter")
    wait_for(lambda: "Queues (1)" in terminal.screen(), timeout=15, what="top again")
    terminal.type("C-c")
    wait_for(lambda: status.exists() and status.read_text().strip() == "130", what="Ctrl-C")
    assert _terminal_settings(terminal, tmp_path / "after_ctrl_c") == before
    sup.stop_cleanly(timeout=30)
    app.close()
