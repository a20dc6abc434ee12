"""Snoozed jobs under real kills: `forklift run` supervisors of tests/apps/snoozing.py
whose worker dies (killed by its own handler, or from outside) on the run after a
snooze, or while the job sleeps out its snooze. The job runs again after each delay, and
its attempts are exact: a snooze spends none, a crash spends its run's, per the crash
rules (supervisor/deaths.py). The single-worker cases are in
tests/integration/test_snooze.py."""

from __future__ import annotations

import os
import secrets
import signal
from pathlib import Path
from typing import Any

import pytest

from forklift.testing import wait_for
from tests.apps import snoozing
from tests.apps.snoozing import Run
from tests.faults.harness import Fleet, Workload

APP = "tests.apps.snoozing:app"
DELAY = 1.0


@pytest.fixture
def fleet_args() -> list[str]:
    # One worker per supervisor: the job's worker is the supervisor's only child.
    return ["--workers", "1", "--lease", "3s", "--grace", "5s"]


@pytest.fixture
def log(fleet: Fleet, tmp_path: Path) -> Path:
    """The handlers' log; the fleet runs the snoozing app, whose handler writes it."""
    path = tmp_path / "snoozing.log"
    fleet.app = APP
    fleet.env[snoozing.LOG_ENV] = str(path)
    return path


def job(workload: Workload, job_id: int) -> dict[str, Any]:
    """The job's state, attempts, crashes, snoozes and error history ({} while the
    database is away)."""
    found = workload.scalar(
        "SELECT json_build_object('state', state, 'attempts', attempts, 'crashes', crashes,"
        " 'snoozes', snoozes, 'errors', errors) FROM {s}.jobs WHERE id = %s",
        job_id,
    )
    return dict(found or {})


def finished(workload: Workload, job_id: int, fleet: Fleet, timeout: float = 25) -> dict[str, Any]:
    def done() -> bool:
        fleet.check_alive()
        return job(workload, job_id).get("state") == "succeeded"

    wait_for(done, timeout, 0.05, f"job {job_id} succeeded")
    return job(workload, job_id)


def runs_of(log: Path, key: str, n: int, fleet: Fleet) -> list[Run]:
    """Wait until `n` runs of `key` are logged; those runs."""

    def logged() -> list[Run] | None:
        fleet.check_alive()
        found = snoozing.runs(log, key)
        return found if len(found) >= n else None

    found: list[Run] = wait_for(logged, 20, 0.02, f"{n} runs of {key}")
    return found


def enqueue(workload: Workload, key: str, plan: list[str]) -> int:
    return workload.app.enqueue("planned", {"key": key, "plan": plan, "seconds": DELAY})


def waited(before: Run, after: Run) -> bool:
    """Whether `after` began once `before`'s snooze was over (both on this host's clock;
    a little slack for the snooze's write, which comes after `before` began)."""
    return after.at - before.at >= DELAY - 0.05


@pytest.mark.parametrize("death", ["kill", "sleep"], ids=["killed_itself", "killed_from_outside"])
def test_a_worker_killed_on_the_run_after_a_snooze_costs_that_run_alone(
    workload: Workload, fleet: Fleet, log: Path, death: str
) -> None:
    key = secrets.token_hex(4)
    fleet.start()
    fleet.wait_ready()
    job_id = enqueue(workload, key, ["snooze", death, "snooze"])
    if death == "sleep":  # killed from outside, its handler running
        dying = runs_of(log, key, 2, fleet)[1]
        os.kill(dying.pid, signal.SIGKILL)
    done = finished(workload, job_id, fleet)
    first, killed, again, last = snoozing.runs(log, key)
    assert [(r.step, r.attempt) for r in (first, killed, again, last)] == [
        ("snooze", 1),
        (death, 1),  # the snooze gave attempt 1 back: it ran again as attempt 1
        ("snooze", 2),  # the crash spent attempt 1
        ("succeed", 2),  # and this snooze spent none
    ]
    assert waited(first, killed) and waited(again, last)
    assert again.pid != killed.pid  # a new worker in the killed one's place
    assert (done["attempts"], done["crashes"], done["snoozes"]) == (2, 1, 2)
    ((charged,),) = [[e["attempt"] for e in done["errors"]]]  # the crash alone
    assert charged == 1


def test_a_worker_killed_while_its_job_sleeps_out_a_snooze_charges_nothing(
    workload: Workload, fleet: Fleet, log: Path
) -> None:
    key = secrets.token_hex(4)
    (sup,) = fleet.start()
    fleet.wait_ready()
    job_id = enqueue(workload, key, ["snooze"])
    (first,) = runs_of(log, key, 1, fleet)
    wait_for(lambda: job(workload, job_id).get("snoozes") == 1, 10, 0.02, "the snooze recorded")
    assert job(workload, job_id)["state"] == "ready"
    os.kill(first.pid, signal.SIGKILL)  # the job is not its worker's any more
    wait_for(lambda: first.pid not in sup.workers(), 10, 0.02, "the worker gone")
    done = finished(workload, job_id, fleet)
    _, last = snoozing.runs(log, key)
    assert (last.step, last.attempt) == ("succeed", 1) and last.pid != first.pid
    assert waited(first, last)
    assert (done["attempts"], done["crashes"], done["snoozes"], done["errors"]) == (1, 0, 1, [])
