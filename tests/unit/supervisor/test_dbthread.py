"""The database thread's schedule: what reads a range of the jobs table is paced by how
long its rounds take; a failed round is retried on the usual schedule."""

from __future__ import annotations

import threading
import time

import pytest

from forklift.errors import DatabaseError
from forklift.supervisor.dbthread import PACED, SLOWEST, DbService, DbThread
from forklift.testing import wait_for


def nothing() -> None:
    pass


@pytest.mark.parametrize(
    ("share", "took", "after"),
    [
        (1.0, 3.0, 0.5),  # not paced: `every`, however long the round took
        (PACED, 0.01, 0.5),  # a quick round: `every`
        (PACED, 0.1, 0.1 / PACED),  # a slow one: 20 times its time
        (PACED, 2.0, SLOWEST),  # never longer than SLOWEST
    ],
)
def test_a_paced_service_waits_longer_after_a_slow_round(
    share: float, took: float, after: float
) -> None:
    service = DbService("stats", 0.5, nothing, share)
    assert service.next_due(100.0, took) == pytest.approx(100.0 + after)


def test_a_slow_round_that_failed_is_retried_after_every_not_paced() -> None:
    rounds = {"ok": 0, "failing": 0}

    def slow(name: str) -> None:
        rounds[name] += 1
        time.sleep(0.05)
        if name == "failing":
            raise DatabaseError("the database went away")

    thread = DbThread(
        [
            DbService("ok", 0.01, lambda: slow("ok"), share=PACED),
            DbService("failing", 0.01, lambda: slow("failing"), share=PACED),
        ]
    )
    runner = threading.Thread(target=thread.run)
    began = time.monotonic()
    runner.start()
    try:
        wait_for(lambda: rounds["failing"] >= 10, what="ten failed rounds")
    finally:
        thread.stop()
        runner.join(timeout=5)
    elapsed = time.monotonic() - began
    # Each good round took at least 0.05 s, so the next waited at least 0.05 / PACED.
    assert 1 <= rounds["ok"] <= 1 + elapsed / (0.05 / PACED)
