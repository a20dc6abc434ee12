"""How fast work resumes after the database comes back, and after a whole supervisor
vanishes: measured on real processes against the private cluster."""

from __future__ import annotations

import time

import pytest

from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.faults.harness import Fleet, Supervisor, Workload, time_until
from tests.faults.injector import Fault, Injector


def first_job_after(cluster: Cluster, workload: Workload, down_for: float) -> float:
    """Stop the database for `down_for` s, start it; seconds from its start to the first
    job completed after it, both read on the database's clock."""
    stopped_at = workload.scalar("SELECT clock_timestamp()")
    cluster.stop("fast")
    time.sleep(down_for)
    cluster.start()  # pg_ctl -w: it accepts connections from here
    done_since = "SELECT count(*) FROM {s}.jobs WHERE completed_at > %s"
    wait_for(lambda: (workload.scalar(done_since, stopped_at) or 0) > 0, 30, 0.01, "a job")
    return float(
        workload.scalar(
            "SELECT extract(epoch FROM min(completed_at) - pg_postmaster_start_time())"
            " FROM {s}.jobs WHERE completed_at > %s",
            stopped_at,
        )
    )


@pytest.fixture
def fleet_args() -> list[str]:
    return ["--workers", "2", "--lease", "30s"]


@pytest.mark.parametrize("down_for", [8.0, pytest.param(20.0, marks=pytest.mark.slow)])
def test_work_resumes_within_a_second_of_the_database_returning(
    down_for: float, cluster: Cluster, workload: Workload, fleet: Fleet
) -> None:
    workload.enqueue(2000, pause=0.05)
    fleet.start()
    fleet.wait_ready()
    wait_for(lambda: workload.succeeded() > 10, 20, 0.05, "work under way")
    assert first_job_after(cluster, workload, down_for) < 1.0
    fleet.check_alive()


def running_on(workload: Workload, sup: Supervisor) -> list[int]:
    """The ids of the jobs `sup`'s workers hold now."""
    owners = [f"%:{pid}:%" for pid in sup.workers()]
    ids = workload.scalar(
        "SELECT array_agg(id) FROM {s}.jobs WHERE state = 'running' AND lease_owner LIKE ANY(%s)",
        owners,
    )
    return list(ids or [])


def seconds_until_rerun(workload: Workload, ids: list[int], timeout: float = 60.0) -> float:
    """Seconds until every one of `ids` runs again (a second attempt running, or done)."""
    rerun = (
        "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND attempts >= 2"
        " AND state IN ('running', 'succeeded')"
    )
    return time_until(lambda: workload.scalar(rerun, ids) == len(ids), timeout, 0.01)


@pytest.mark.parametrize("replacement", ["another replica", "a fresh supervisor"])
def test_a_vanished_process_groups_jobs_run_again_within_two_seconds(
    replacement: str, workload: Workload, fleet: Fleet
) -> None:
    # The OOM killer of a container, or a node lost: the supervisor and its workers
    # vanish at once, no one left to charge their jobs. Their leases have 30 s to go.
    workload.enqueue(2, spins=1000, pause=4.0)
    (doomed,) = fleet.start()
    fleet.wait_ready()
    held = wait_for(lambda: len(ids := running_on(workload, doomed)) == 2 and ids, 20, 0.05)
    if replacement == "another replica":
        fleet.start()  # idle: room for the jobs the doomed one held
        fleet.wait_ready()
    doomed.kill_group()
    if replacement == "a fresh supervisor":
        fleet.replace(doomed)  # systemd's Restart=, Kubernetes restarting the container
    limit = 2.0 if replacement == "another replica" else 3.0  # it boots first
    assert seconds_until_rerun(workload, held) < limit
    errors = workload.scalar("SELECT array_agg(last_error) FROM {s}.jobs WHERE id = ANY(%s)", held)
    assert errors and all(e.startswith("WorkerLost") for e in errors), errors


@pytest.mark.parametrize(
    "fault", [Fault.DB_RESTART, Fault.DB_OUTAGE, Fault.TCP_STALL, Fault.TERMINATE]
)
def test_no_live_worker_is_declared_vanished(
    fault: Fault, workload: Workload, fleet: Fleet, injector: Injector
) -> None:
    # Every session (liveness locks included) ends in a restart, an outage of seconds or
    # a storm, and a stall holds them silent: a live supervisor must take its lock back
    # long before a peer would charge its workers' jobs (after an outage too: no backoff
    # may outgrow the peer's second sighting).
    workload.enqueue(60, spins=1000, pause=2.0)
    fleet.start(2)
    fleet.wait_ready()
    wait_for(
        lambda: (
            (workload.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'running'") or 0) >= 4
        ),
        20,
        0.05,
    )
    if fault is Fault.DB_OUTAGE:
        injector.outage = 12.0  # long enough for any reconnect backoff to outgrow a second
    for _ in range(2):
        injector.inject(fault)
        time.sleep(1.5)  # past the confirmation time of a peer's check
    lost = workload.scalar("SELECT count(*) FROM {s}.jobs WHERE errors::text LIKE '%%WorkerLost%%'")
    assert lost == 0, fleet.output()[-3000:]
    fleet.check_alive()
