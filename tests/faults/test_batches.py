"""A batch under faults: 1,000 jobs across two supervisors while workers are SIGKILLed
throughout and one supervisor's whole group is killed, or while the database restarts
around the last completions. Every job's effect commits once, the results are complete,
and the callback runs exactly once, after every job, seeing all of them."""

from __future__ import annotations

import time

import pytest

from forklift.testing import wait_for
from tests.acceptance.test_observability import samples
from tests.faults.harness import Fleet, Workload
from tests.faults.injector import Fault, Injector

JOBS = 1000


def check_once(workload: Workload, fleet: Fleet, batch_id: int) -> None:
    """The run's invariants, and the callback's single run and what it saw."""
    batch = workload.app.get_batch(batch_id)
    status = batch.wait(timeout=300)
    assert (status.succeeded, status.dead, status.outcome) == (JOBS, 0, "succeeded")
    assert status.callback_job_id is not None
    seen = workload.app.result(status.callback_job_id, timeout=120)
    assert seen == {
        "batch": batch_id, "succeeded": JOBS, "dead": 0, "pending": 0, "results": JOBS,
        "keys_match": True,
    }  # fmt: skip
    results = batch.results()
    assert sorted(results.values()) == sorted(f"b-{i}" for i in range(JOBS))
    workload.wait_finished(timeout=60, check=fleet.procs)
    verdict = workload.verdict()
    assert verdict.problems == [], fleet.output()[-5000:]
    assert verdict.succeeded == JOBS + 1  # and the callback
    callbacks = workload.scalar(
        "SELECT count(*) FROM {s}.jobs WHERE idempotency_key LIKE 'forklift:batch:%%'"
    )
    assert callbacks == 1
    assert workload.scalar("SELECT count(*) FROM {s}.effects WHERE key = 'gather'") == 1


@pytest.mark.timeout(600)
def test_a_batch_under_worker_and_group_kills_calls_back_once(
    workload: Workload, fleet: Fleet, injector: Injector
) -> None:
    batch = workload.enqueue_batch(JOBS, spins=20_000, pause=0.01)
    fleet.start(2)
    fleet.wait_ready()
    kills, group_killed = 0, False
    # Kill workers until a tenth is left (the callback then runs undisturbed: it is one
    # job, and its crash budget is the default 2), the whole group of one supervisor once.
    while (left := workload.unfinished("work")) is None or left > JOBS // 10:
        if not group_killed and left is not None and left < JOBS // 2:
            injector.inject(Fault.KILL_GROUP)
            group_killed = True
        else:
            injector.inject(Fault.KILL_WORKER)
            kills += 1
        time.sleep(0.5)
    assert group_killed and kills >= 5, (kills, group_killed)
    check_once(workload, fleet, batch.id)


@pytest.mark.timeout(600)
def test_a_batch_whose_last_completions_meet_a_database_restart_calls_back_once(
    workload: Workload, fleet: Fleet, injector: Injector
) -> None:
    batch = workload.enqueue_batch(JOBS, spins=5_000, pause=0.005)
    fleet.start(2)
    fleet.wait_ready()
    while (left := workload.unfinished("work")) is None or left > 8:
        time.sleep(0.02)
    injector.inject(Fault.DB_RESTART)  # fast or immediate (a crash), at random
    check_once(workload, fleet, batch.id)

    # No supervisor or worker died: the fleet's metrics count the batch once (whoever
    # finished it: a worker after its completion, or a supervisor's sweep).
    def counted() -> float:
        text = "\n".join(sup.get("/metrics")[1] for sup in fleet.procs)
        return samples(text, "forklift_batches_total", outcome="succeeded")

    wait_for(lambda: counted() >= 1, timeout=10, what="the batch in the metrics")
    assert counted() == 1
