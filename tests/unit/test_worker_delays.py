"""The worker's retry delays: one Backoff each, with the numbers they always had."""

from __future__ import annotations

import pytest

from forklift.backoff import Streak
from forklift.workers.completer import RETRY
from forklift.workers.listener import RECONNECT
from forklift.workers.worker import CLAIM_RETRY


def delays(streak: Streak, n: int = 10) -> list[float]:
    return [streak.failed() for _ in range(n)]


def test_a_failed_claim_waits_0_1_s_doubling_up_to_half_a_second() -> None:
    # Short: work must resume within a second of the database's return.
    assert delays(Streak(CLAIM_RETRY), 5) == [0.1, 0.2, 0.4, 0.5, 0.5]


def test_the_listener_reconnects_after_0_5_s_doubling_up_to_10_s() -> None:
    assert delays(Streak(RECONNECT)) == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0, 10.0, 10.0]


def test_the_completer_retries_after_0_05_s_doubling_up_to_1_s() -> None:
    assert delays(Streak(RETRY), 7) == pytest.approx([0.05, 0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_a_success_starts_the_delays_over() -> None:
    streak = Streak(CLAIM_RETRY)
    delays(streak, 3)
    streak.succeeded()
    assert streak.failed() == 0.1
