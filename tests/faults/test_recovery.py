"""How fast work resumes after the database comes back, and after a whole supervisor
vanishes: measured on real processes against the private cluster."""

from __future__ import annotations

import time

import pytest

from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.faults.harness import Fleet, Workload


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


def test_work_resumes_within_a_second_of_the_database_returning(
    cluster: Cluster, workload: Workload, fleet: Fleet
) -> None:
    workload.enqueue(2000, pause=0.05)
    fleet.start()
    fleet.wait_ready()
    wait_for(lambda: workload.succeeded() > 10, 20, 0.05, "work under way")
    assert first_job_after(cluster, workload, down_for=8.0) < 1.0
    fleet.check_alive()


@pytest.mark.slow
def test_work_resumes_within_a_second_of_a_twenty_second_outage(
    cluster: Cluster, workload: Workload, fleet: Fleet
) -> None:
    workload.enqueue(2000, pause=0.05)
    fleet.start()
    fleet.wait_ready()
    wait_for(lambda: workload.succeeded() > 10, 20, 0.05, "work under way")
    assert first_job_after(cluster, workload, down_for=20.0) < 1.0
    fleet.check_alive()
