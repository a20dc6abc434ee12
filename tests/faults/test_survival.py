"""Every kind of fault, one at a time, against a workload that must end with every job
succeeded once (or dead, when poisoned), whatever was done to it meanwhile.

The default run injects each fault once into a few hundred jobs; the slow variants
(`pytest -m slow tests/faults`) into 2,000 jobs at concurrency 1 and 4, with the
database down for 20 s in its outage.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from forklift.embedded import Cluster
from tests.acceptance.proxy import Proxy
from tests.faults.harness import Fleet, Workload
from tests.faults.injector import Fault, Injector


def survive(
    fault: Fault, workload: Workload, fleet: Fleet, injector: Injector, jobs: int, pause: float
) -> None:
    """Run `jobs` jobs on two supervisors, inject `fault` mid-run, check the invariants."""
    workload.enqueue(jobs, spins=20_000, pause=pause)
    workload.enqueue_poison(1)
    fleet.start(2)
    fleet.wait_ready()
    injection = injector.inject(fault)
    recovered = injector.recovery(injection.over, timeout=60)
    assert recovered is not None, f"no job succeeded within 60 s after {fault}"
    if injection.readyz_503 is not None:
        assert injection.readyz_503, "/readyz did not say 503 while the database was down"
    workload.wait_finished(timeout=300, check=fleet.procs)
    verdict = workload.verdict()
    assert verdict.problems == [], fleet.output()[-5000:]
    assert verdict.succeeded == jobs and verdict.dead == 1
    fleet.check_alive()  # recovered on their own (a killed one was started again, as
    # systemd would: the fleet plays that part)


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name.lower())
def test_a_fault_loses_and_doubles_nothing(
    fault: Fault, workload: Workload, fleet: Fleet, injector: Injector
) -> None:
    survive(fault, workload, fleet, injector, jobs=200, pause=0.03)


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name.lower())
def test_a_fault_in_two_thousand_jobs_loses_and_doubles_nothing(
    fault: Fault,
    concurrency: int,
    cluster: Cluster,
    proxy: Proxy,
    workload: Workload,
    tmp_path: Path,
) -> None:
    args = ["--workers", "2", "--concurrency", str(concurrency), "--lease", "3s", "--grace", "5s"]
    fleet = Fleet.for_workload(workload, tmp_path, args, proxy.dsn_through(workload.dsn))
    injector = Injector(cluster, proxy, fleet, workload, lease=3.0, outage=20.0)
    try:
        survive(fault, workload, fleet, injector, jobs=2000, pause=0.01)
    finally:
        fleet.kill()
