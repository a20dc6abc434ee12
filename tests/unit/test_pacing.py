"""Pacing: when the claim loop claims, and how many (no database)."""

from __future__ import annotations

from forklift.workers.config import WorkerConfig
from forklift.workers.holdings import Holdings
from forklift.workers.pacing import Pacing
from forklift.workers.prefetch import Prefetch
from tests.unit.test_holdings import held


def pacing_of(concurrency: int, held_jobs: int, started: int) -> tuple[Pacing, Holdings]:
    config = WorkerConfig(concurrency=concurrency)
    holdings = Holdings(concurrency)
    for i in range(held_jobs):
        ctx = held(i)
        holdings.adopt(ctx)
        if i < started:
            holdings.start(ctx, 0.0)
    return Pacing(config, holdings, Prefetch(concurrency)), holdings


def test_a_free_slot_with_nothing_waiting_for_one_is_claimed_for_at_once() -> None:
    pacing, _ = pacing_of(concurrency=4, held_jobs=3, started=3)
    assert pacing.worth_claiming(1)


def test_with_claimed_ahead_jobs_waiting_it_claims_once_half_is_free() -> None:
    pacing, _ = pacing_of(concurrency=1, held_jobs=10, started=1)
    pacing.ahead = 20  # the worker keeps 21 claimed: slots plus claimed ahead
    assert not pacing.worth_claiming(1)  # one job returned, nine still wait their turn
    assert not pacing.worth_claiming(10)
    assert pacing.worth_claiming(11)  # half of 21


def test_the_wait_between_claims_ends_before_waiting_jobs_would_be_overdue() -> None:
    pacing, _ = pacing_of(concurrency=1, held_jobs=2, started=1)
    assert pacing.busy_wait() == min(pacing.config.poll_interval, pacing.prefetch.release_after)
    idle, _ = pacing_of(concurrency=1, held_jobs=1, started=1)
    assert idle.busy_wait(0.25) == 0.25


def test_after_taking_its_share_of_a_limit_it_claims_again_once_all_it_took_has_started() -> None:
    """A claim under a limit that took this worker's share of its slots leaves the rest to
    the other workers: claiming again while what it took still waits would find those
    slots full and take nothing, and hold the limit's lock while doing it."""
    pacing, holdings = pacing_of(concurrency=1, held_jobs=0, started=0)
    first, second = held(1), held(2)
    holdings.adopt(first)
    holdings.adopt(second)
    holdings.start(first, 0.0)
    pacing.ahead = 20
    assert pacing.worth_claiming(19)  # half of 21 free: claim, ordinarily
    pacing.shared = True
    assert not pacing.worth_claiming(19)  # one of its share still waits
    assert holdings.free_slot(first)
    holdings.end(first)
    assert holdings.start(second, 0.0)
    assert pacing.worth_claiming(20)  # all it took has started
