"""Every kind of fault, one at a time, against a workload that must end with every job
succeeded once (or dead, when poisoned), whatever was done to it meanwhile."""

from __future__ import annotations

import pytest

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
    workload.wait_finished(timeout=180, check=fleet.procs)
    verdict = workload.verdict()
    assert verdict.problems == [], fleet.output()[-5000:]
    assert verdict.succeeded == jobs and verdict.dead == 1
    fleet.check_alive()


@pytest.mark.parametrize("fault", list(Fault), ids=lambda f: f.name.lower())
def test_a_fault_loses_and_doubles_nothing(
    fault: Fault, workload: Workload, fleet: Fleet, injector: Injector
) -> None:
    survive(fault, workload, fleet, injector, jobs=400, pause=0.05)
