"""Helpers for tests that run forklift's processes: the real CLI in a process, and waiting.

`ForkliftProcess` starts `python -m forklift ...` in its own session (so a Ctrl-C of the
test run stays the test run's), with its output in a file (never a pipe that fills up
and blocks it), and finds its children through /proc. `wait_for` polls a condition
until it holds or a deadline passes: tests wait on conditions, never on sleeps.
forklift's own tests and benchmarks use both (through `forklift.testing`).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from signal import SIGKILL, SIGSTOP, SIGTERM
from typing import Any


class WaitTimedOut(AssertionError):
    """A condition did not hold before its deadline."""


def wait_for(
    condition: Callable[[], Any], timeout: float = 10.0, interval: float = 0.02, what: str = ""
) -> Any:
    """Poll `condition` until it returns something truthy and return that; past
    `timeout` seconds raise WaitTimedOut naming `what`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise WaitTimedOut(f"timed out after {timeout}s waiting for {what or condition}")
        time.sleep(interval)


def child_pids(pid: int) -> list[int]:
    """The direct children of `pid`, unreaped ones included (empty once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def session_pids(sid: int) -> list[int]:
    """Every process of session `sid`: a process started in a session of its own, its
    children (each in a process group of its own) and whatever they started."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def process_state(pid: int) -> str | None:
    """`pid`'s state as /proc shows it (R, S, T: stopped, Z: a zombie, ...), or None once
    it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def calls_handler(pid: int, job_id: int) -> bool:
    """Whether worker `pid`'s title (`...: running render#42`) names job `job_id`: it does
    from the moment its handler is called, the moment from which the worker's death is
    charged to it (a job claimed but not started yet is released uncharged)."""
    return process_title(pid).endswith(f"#{job_id}")


def process_title(pid: int) -> str:
    """What `ps` shows for `pid` (its setproctitle title), or "" once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").strip("\0 ")
    except OSError:
        return ""


class ForkliftProcess:
    """A `python -m forklift ARGS...` process in its own session, its output in a file."""

    def __init__(
        self,
        args: Sequence[str],
        env: Mapping[str, str],
        log_path: Path,
        *,
        cwd: Path | None = None,
    ) -> None:
        self.args = list(args)
        self.log_path = log_path
        with log_path.open("wb") as log:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "forklift", *args],
                env=dict(env),
                cwd=cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.popen.pid
        self._output: str | None = None  # all of it, kept once it has stopped

    # -- looking at it -------------------------------------------------------------------

    def output(self) -> str:
        """What it has printed so far; once stopped, all of it (also after the file is gone)."""
        if self._output is not None:
            return self._output
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def poll(self) -> int | None:
        return self.popen.poll()

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def check_alive(self) -> None:
        """Raise, with the end of its output, if it has exited."""
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"forklift {' '.join(self.args[:1])} (pid {self.pid}) exited with "
                f"{self.popen.returncode}:\n{self.output()[-3000:]}"
            )

    def children(self) -> list[int]:
        """Its workers: the children in a process group of their own (a supervisor's fork
        server is in the supervisor's)."""
        found = []
        for pid in child_pids(self.pid):
            with contextlib.suppress(ProcessLookupError):
                if os.getpgid(pid) != os.getpgid(self.pid):
                    found.append(pid)
        return found

    def titles(self) -> list[str]:
        """The process titles of its children (`forklift worker 1/2 [...]: running x#7`)."""
        return [t for t in (process_title(pid) for pid in self.children()) if t]

    # -- acting on it --------------------------------------------------------------------

    def signal(self, signum: int) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signum)

    def wait(self, timeout: float) -> int:
        """Wait for its exit (subprocess.TimeoutExpired past `timeout`); the exit code."""
        code = self.popen.wait(timeout=timeout)
        self._output = self.output()
        return code

    def kill(self) -> None:
        """SIGKILL its children and it, and reap it (teardown: nothing is left running)."""
        if self.popen.poll() is None:
            for pid in child_pids(self.pid):  # its fork server too
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, SIGKILL)
            self.popen.kill()
        self.popen.wait(timeout=10)
        self._output = self.output()

    def kill_session(self) -> None:
        """SIGKILL it and everything it started, as a lost node or a container's cgroup
        kill would: it is stopped first, so it sees none of its children die, and killed
        last. Killed before them, it would orphan their process groups, and the kernel
        wakes a stopped process in an orphaned group (SIGHUP, SIGCONT): a worker a test
        had stopped mid-job would go on and finish it."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, SIGSTOP)
        for pid in sorted(session_pids(self.pid), key=lambda pid: pid == self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, SIGKILL)
        self.popen.wait(timeout=10)
        self._output = self.output()

    def stop(self, timeout: float = 60.0, signum: int = SIGTERM) -> int:
        """Send `signum` (SIGTERM) and wait; past `timeout`, kill(). Return the exit code."""
        self.signal(signum)
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return self.popen.returncode
