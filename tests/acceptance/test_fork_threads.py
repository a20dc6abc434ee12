"""The process that forks the workers has no other thread at any fork: not at boot, not
for a respawn after a SIGKILL, a HUP reload, a TTIN, nor an autoscale step. A fork in a
threaded process copies locks that other threads hold, and the child may wait on them
forever. Each fork appends the forking process's pid and thread count to a log the test
names (FORKLIFT_TEST_FORK_LOG)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import forklift
from forklift.testing import child_pids, wait_for


def forks(log: Path) -> list[tuple[int, int]]:
    """(pid, threads) of each fork so far."""
    try:
        lines = log.read_text().splitlines()
    except FileNotFoundError:
        return []
    return [(int(pid), int(threads)) for pid, threads in (line.split() for line in lines)]


def forked_after(log: Path, before: int, what: str) -> None:
    """Wait until a fork came after the first `before` ones (for `what`)."""
    wait_for(lambda: len(forks(log)) > before, timeout=20, what=f"a fork for {what}")


def test_every_fork_is_made_by_a_process_with_one_thread(
    dsn: str, schema: str, env: dict[str, str], tmp_path: Path, forklift_cli: Any
) -> None:
    log = tmp_path / "forks"
    env["FORKLIFT_TEST_FORK_LOG"] = str(log)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    wait_for(lambda: len(sup.children()) == 1, what="one child")
    # Booted: its helper threads run (the HTTP server answers) before anything else forks.
    wait_for(lambda: "supervisor.http" in sup.output(), what="the HTTP server")
    events: list[tuple[str, int]] = [("boot", 0)]

    def child_pids() -> set[int]:
        return set(sup.children())

    wait_for(lambda: len(child_pids()) == 1, what="one worker")
    (first,) = child_pids()
    events.append(("respawn", len(forks(log))))
    os.kill(first, signal.SIGKILL)
    forked_after(log, events[-1][1], "the respawn")
    wait_for(lambda: len(child_pids()) == 1 and first not in child_pids(), what="a new worker")

    events.append(("reload", len(forks(log))))
    sup.signal(signal.SIGHUP)
    forked_after(log, events[-1][1], "the reload")

    events.append(("ttin", len(forks(log))))
    sup.signal(signal.SIGTTIN)
    forked_after(log, events[-1][1], "the TTIN")
    wait_for(lambda: len(child_pids()) == 2, what="two workers")
    sup.stop_cleanly(timeout=15)
    seen = forks(log)
    assert [threads for _, threads in seen] == [1] * len(seen), (events, seen)


def test_an_autoscale_step_forks_from_a_process_with_one_thread(
    dsn: str, schema: str, env: dict[str, str], tmp_path: Path, forklift_cli: Any
) -> None:
    log = tmp_path / "forks"
    env["FORKLIFT_TEST_FORK_LOG"] = str(log)
    sup = forklift_cli("run", "tests.apps.basic:app", "--autoscale", "1:2", "--autoscale-idle", "1")
    wait_for(lambda: "supervisor.http" in sup.output(), what="the HTTP server")
    wait_for(lambda: len(forks(log)) >= 1, what="the first child")
    booted = len(forks(log))
    app = forklift.App(dsn, schema=schema)
    app.enqueue_many([("sleep", {"seconds": 1.0}) for _ in range(8)])
    wait_for(lambda: "supervisor.scale workers=2" in sup.output(), timeout=20, what="a scale-up")
    forked_after(log, booted, "the autoscale step")
    sup.stop_cleanly(timeout=20)
    app.close()
    seen = forks(log)
    assert [threads for _, threads in seen] == [1] * len(seen), seen


def test_a_supervisor_whose_fork_server_is_gone_stops_and_says_so(forklift_cli: Any) -> None:
    """No fork server, no new worker: the supervisor stops (its workers finish their
    jobs) with an error that names the fork server, rather than run on short of workers."""
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    wait_for(lambda: len(sup.children()) == 1, what="one child")
    (server,) = set(child_pids(sup.pid)) - set(sup.children())
    os.kill(server, signal.SIGKILL)
    sup.signal(signal.SIGTTIN)  # a worker more: the fork server is asked for one
    assert sup.wait(timeout=20) != 0
    assert "the fork server is lost" in sup.output(), sup.output()[-2000:]
    assert "supervisor.stopping mode=graceful" in sup.output()
