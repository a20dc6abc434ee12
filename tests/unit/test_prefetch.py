"""The prefetch policy: tiny jobs are claimed ahead, long ones never, and what waits
behind a long-running job is released."""

from __future__ import annotations

import pytest

from forklift.workers.prefetch import Prefetch, PrefetchConfig


def measured(slots: int, claim: float, job: float) -> Prefetch:
    p = Prefetch(slots)
    p.observe_claim(claim)
    p.observe_job(job)
    return p


def test_nothing_is_claimed_ahead_before_a_job_was_measured() -> None:
    p = Prefetch(1)
    p.observe_claim(0.001)
    assert p.ahead() == 0


def test_tiny_jobs_are_claimed_ahead_as_far_as_they_start_within_the_budget() -> None:
    p = measured(slots=1, claim=0.001, job=0.00005)  # 1 ms claims, 50 us no-ops
    assert p.budget == pytest.approx(0.004)  # four claim round trips
    # 4 ms / (50 us handler + 50 us worker overhead) = 40 jobs ahead.
    assert p.ahead() == 40
    assert measured(slots=4, claim=0.001, job=0.00005).ahead() == 160  # per slot


@pytest.mark.parametrize("job", [0.005, 0.05, 10.0])
def test_a_job_longer_than_the_budget_is_never_claimed_ahead(job: float) -> None:
    assert measured(slots=1, claim=0.001, job=job).ahead() == 0


def test_a_long_job_running_now_stops_claiming_ahead_whatever_the_mean_says() -> None:
    p = measured(slots=1, claim=0.001, job=0.00005)
    assert p.ahead(longest_running=0.001) > 0
    assert p.ahead(longest_running=0.010) == 0  # past the 4 ms budget: a long one


def test_waiting_jobs_are_overdue_once_a_running_job_outruns_the_release_budget() -> None:
    p = measured(slots=1, claim=0.001, job=0.00005)
    assert p.release_after == pytest.approx(0.02)  # 5 budgets, at least 20 ms
    assert not p.overdue(0.019)
    assert p.overdue(0.021)


def test_the_means_follow_the_samples_and_the_cap_holds() -> None:
    p = Prefetch(2, PrefetchConfig(cap=20))
    p.observe_claim(0.001)
    for _ in range(50):
        p.observe_job(0.0)
    assert p.ahead() == 20  # the cap, not 4 ms / 50 us x 2 = 160
    for _ in range(50):
        p.observe_job(1.0)
    assert p.job_time == pytest.approx(1.0, rel=1e-3) and p.ahead() == 0
