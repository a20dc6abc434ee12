"""Scaling: the target TTIN/TTOU move within bounds, and the autoscale step."""

from __future__ import annotations

import pytest

from forklift.errors import DatabaseError
from forklift.supervisor.child import Children, RunningJob
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.scaling import AUTOSCALE_EVERY, Scaling
from forklift.workers.config import WorkerConfig
from tests.unit.supervisor.conftest import FakeStore, make_child


def test_a_fixed_pool_moves_between_one_and_many() -> None:
    scaling = Scaling(SupervisorConfig(workers=2), FakeStore())
    assert scaling.target == 2 and scaling.autoscaler is None
    scaling.set_target(0)
    assert scaling.target == 1
    scaling.set_target(5)
    assert scaling.target == 5


def test_an_autoscaled_pool_starts_at_its_minimum_and_stays_within_bounds() -> None:
    scaling = Scaling(SupervisorConfig(autoscale=(2, 4)), FakeStore())
    assert scaling.target == 2
    scaling.set_target(9)
    assert scaling.target == 4
    scaling.set_target(1)
    assert scaling.target == 2


def test_autoscale_goes_by_the_backlog_read_off_the_loop_and_grows_when_all_are_busy(
    children: Children, store: FakeStore
) -> None:
    config = SupervisorConfig(autoscale=(1, 3), worker=WorkerConfig(concurrency=1))
    scaling = Scaling(config, store)
    make_child(children, 41, jobs={1: RunningJob(1, "render", 0.0, None)})
    store.backlog = 10
    scaling.autoscale(children.live(), now=99.0)
    assert scaling.target == 1 and store.calls == []  # the loop itself never asks
    scaling.read_backlog()  # the database thread's round
    scaling.autoscale(children.live(), now=100.0 + AUTOSCALE_EVERY)
    assert scaling.target == 2
    scaling.autoscale(children.live(), now=100.0 + AUTOSCALE_EVERY * 1.5)
    assert scaling.target == 2  # not due yet
    store.down = True
    with pytest.raises(DatabaseError):
        scaling.read_backlog()
    scaling.autoscale(children.live(), now=100.0 + AUTOSCALE_EVERY * 3)
    assert scaling.target == 2  # no backlog to go by: no change
