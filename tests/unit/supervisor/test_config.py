"""SupervisorConfig: what it refuses, and the budgets it derives."""

from __future__ import annotations

import pytest

from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.states import StopMode
from forklift.workers.config import WorkerConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers must be >= 1"),
        ({"workers": -3}, "workers must be >= 1"),
        ({"max_jobs_per_child": 0}, "max_jobs_per_child"),
        ({"max_memory_per_child": 0.0}, "max_memory_per_child"),
        ({"max_memory_per_child": -5.0}, "max_memory_per_child"),
        ({"autoscale": (0, 3)}, "MIN <= MAX"),
        ({"autoscale": (4, 2)}, "MIN <= MAX"),
        ({"autoscale": (0, 0)}, "MIN <= MAX"),
    ],
)
def test_config_rejects_nonsense(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SupervisorConfig(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("child_timeout", [0.0, -1.0])
def test_config_rejects_a_child_timeout_that_would_kill_every_child(child_timeout: float) -> None:
    # Children report every 0.5 s; a child_timeout of 0 makes kill_unresponsive SIGKILL
    # every child on the tick it starts (silent > 0), a crash loop with nothing crashing.
    with pytest.raises(ValueError, match="child_timeout"):
        SupervisorConfig(workers=1, child_timeout=child_timeout)


def test_config_rejects_a_negative_kill_grace() -> None:
    with pytest.raises(ValueError, match="kill_grace"):
        SupervisorConfig(workers=1, kill_grace=-1.0)


def test_config_accepts_sensible_settings() -> None:
    cfg = SupervisorConfig(
        workers=1, max_jobs_per_child=1, max_memory_per_child=0.5, autoscale=(2, 2)
    )
    assert cfg.autoscale == (2, 2)
    assert SupervisorConfig().workers >= 1  # the CPU count


def test_shutdown_budget_is_grace_plus_kill_grace_plus_a_margin() -> None:
    cfg = SupervisorConfig(workers=1, worker=WorkerConfig(grace=7.5), kill_grace=1.25)
    assert cfg.shutdown_budget == 7.5 + 1.25 + 2.0
    assert SupervisorConfig(workers=1).shutdown_budget == 30.0 + 3.0 + 2.0
    zero = SupervisorConfig(workers=1, worker=WorkerConfig(grace=0.0), kill_grace=0.0)
    assert zero.shutdown_budget == 2.0


def test_stop_budgets_a_graceful_stop_grace_then_kill_grace_a_fast_one_kill_grace() -> None:
    cfg = SupervisorConfig(workers=1, worker=WorkerConfig(grace=7.5), kill_grace=1.25)
    assert cfg.stop_budget(StopMode.GRACEFUL) == 7.5 + 1.25
    assert cfg.stop_budget(StopMode.FAST) == 1.25
    # systemd is told the budget and a 2 s margin (EXTEND_TIMEOUT_USEC).
    assert cfg.stop_timeout(StopMode.GRACEFUL) == 7.5 + 1.25 + 2.0 == cfg.shutdown_budget
    assert cfg.stop_timeout(StopMode.FAST) == 1.25 + 2.0
