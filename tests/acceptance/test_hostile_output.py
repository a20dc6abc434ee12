"""A handler's hostile error in a real terminal (tmux): `jobs list`, `jobs show` and
`top --once` show its escape sequences escaped, and nothing else on the screen moves."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _display
from forklift.testing import wait_for
from tests.acceptance.conftest import wait_state
from tests.tools import tool

# Clear the screen and home the cursor, turn red, rename the pane (OSC 2), forge a line
# of `jobs show`, then a C1 CSI, DEL and a right-to-left override.
HOSTILE = (
    "\x1b[2J\x1b[H\x1b[31mFAKE: all queues healthy\x1b]2;PWNED\x07"
    "\r\n  attempts 0 of 0 (FAKE)\u009b\x7f\u202eevil"
)
# A name stored before names refused such characters (or written by hand).
HOSTILE_TASK = "fail\x1b]2;TASKPWN\x07\u202e"


class Terminal:
    """A shell in a wide and tall tmux pane (a whole `jobs show` fits, no row wraps) on a
    private tmux server."""

    def __init__(self, name: str, env: dict[str, str]) -> None:
        tmux = tool("tmux", install="apt-get install tmux; scripts/setup does")
        self.base = [tmux, "-L", name, "-f", "/dev/null"]
        keep = ("FORKLIFT_DATABASE_URL", "FORKLIFT_SCHEMA", "PYTHONPATH", "PATH")
        shell = ["env", *(f"{k}={env[k]}" for k in keep if k in env), "TERM=xterm-256color"]
        shell += ["PS1=$ ", "bash", "--norc", "--noprofile"]
        command = [*self.base, "new-session", "-d", "-s", "t", "-x", "200", "-y", "90"]
        subprocess.run([*command, shlex.join(shell)], check=True, timeout=10)

    def tmux(self, *args: str) -> str:
        done = subprocess.run(
            [*self.base, *args], capture_output=True, text=True, check=True, timeout=10
        )
        return done.stdout

    def run(self, step: int, command: str) -> list[str]:
        """Clear the pane, print a marker, run `command`; the screen's lines from the
        marker to the end marker once it is done."""
        self.tmux("send-keys", "-t", "t", f"clear; echo MARK-{step}; {command}; echo END-{step}")
        self.tmux("send-keys", "-t", "t", "Enter")
        screen = wait_for(
            lambda: (
                (shown := self.tmux("capture-pane", "-p", "-t", "t"))
                and f"\nEND-{step}" in shown
                and shown
            ),
            timeout=30,
            what=f"{command} done",
        )
        lines = str(screen).splitlines()
        return lines[: lines.index(f"END-{step}") + 1]

    def styled(self) -> str:
        """The pane with its colours and attributes as escape sequences."""
        return self.tmux("capture-pane", "-p", "-e", "-t", "t")

    def title(self) -> str:
        return self.tmux("display", "-p", "-t", "t", "#{pane_title}").strip()

    def close(self) -> None:
        subprocess.run([*self.base, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def terminal(env: dict[str, str], schema: str) -> Iterator[Terminal]:
    term = Terminal(f"forklift-hostile-{schema}", env)
    yield term
    term.close()


def test_a_hostile_error_is_shown_escaped_and_moves_nothing(
    env: dict[str, str],
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    forklift_cli: Any,
    terminal: Terminal,
) -> None:
    app = forklift.App(dsn, schema=schema)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    job_id = app.enqueue("fail", {"message": HOSTILE})
    wait_state(db, schema, job_id, "dead", timeout=30)
    other = app.enqueue("fail", {"message": "plain"})
    wait_state(db, schema, other, "dead", timeout=30)
    db.execute(f"UPDATE {schema}.jobs SET task = %s WHERE id = %s", (HOSTILE_TASK, other))
    title = terminal.title()
    forklift_cmd = f"{shlex.quote(sys.executable)} -m forklift"
    escaped = "\\x1b[2J\\x1b[H\\x1b[31mFAKE"

    lines = terminal.run(1, f"{forklift_cmd} jobs list --state dead")
    assert lines[0] == "MARK-1" and lines[1].startswith("id ") and lines[-1] == "END-1", lines
    [row] = [line for line in lines if line.startswith(f"{job_id} ")]
    assert f"RuntimeError: {escaped}" in row
    [renamed] = [line for line in lines if line.startswith(f"{other} ")]
    assert "fail\\x1b]2;TASKPWN\\x07\\u202e" in renamed
    assert len(lines) == 5  # marker, header, two jobs, end: no forged or wrapped line

    lines = terminal.run(2, f"{forklift_cmd} jobs show {job_id}")
    assert lines[0] == "MARK-2" and lines[1].startswith(f"job {job_id}: fail in queue"), lines
    # One attempts line, the real one: the error's \r\n forged none.
    assert [line for line in lines if line.startswith("  attempts ")] == ["  attempts     5 of 5"]
    [last] = [line for line in lines if line.startswith("  last error ")]
    assert last == f"  last error   RuntimeError: {_display.line(HOSTILE)}"
    assert sum(line.startswith("    RuntimeError: ") for line in lines) == 5  # each attempt
    assert "\x1b[" not in terminal.styled()  # no colour or attribute was turned on

    lines = terminal.run(3, f"{forklift_cmd} top --once")
    assert lines[0] == "MARK-3" and lines[1].startswith("forklift top "), lines
    [failure] = [line for line in lines if line.startswith(f"#{job_id} ")]
    assert escaped in failure
    assert any(line.startswith(f"#{other:<8} fail\\x1b]2;TASKP ") for line in lines), lines

    assert terminal.title() == title and "PWNED" not in title  # the pane was not renamed
    # The text logs of the supervisor that ran it say the error escaped too.
    assert "\x1b" not in sup.output() and "\u202e" not in sup.output()
    # --json keeps the error whole, as JSON escapes that no terminal acts on.
    shown = subprocess.run(
        [sys.executable, "-m", "forklift", "jobs", "show", str(job_id), "--json"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    assert not any(_display.unsafe(ch) for ch in shown.stdout.replace("\n", ""))
    assert json.loads(shown.stdout)["last_error"] == f"RuntimeError: {HOSTILE}"
    sup.stop_cleanly(timeout=30)
    app.close()
