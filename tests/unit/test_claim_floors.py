"""When a worker's claims rewind (read from the start of the line, not from their floor):
pure logic of workers/claimer.py's Floors."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from forklift.store import Claim
from forklift.workers.claimer import REWIND_EVERY, REWIND_SHARE, Floors

AT = datetime(2026, 1, 1, tzinfo=UTC)


def started() -> Floors:
    """Floors after a process's first claim (a rewind: it has no floor yet)."""
    floors = Floors()
    assert floors.floor("q", time.monotonic()) is None
    floors.claimed("q", time.monotonic(), Claim([], floor=AT), None)
    return floors


def rewound(floors: Floors, took: float) -> float:
    """Have `floors` record a rewind that took `took` seconds; when it began."""
    began = time.monotonic() - took
    floors.claimed("q", began, Claim([], floor=AT), None)
    return began


def test_the_first_claim_rewinds_then_claims_start_from_the_floor_until_the_next_rewind() -> None:
    floors = started()
    began = rewound(floors, 0.0)
    assert floors.floor("q", began + REWIND_EVERY / 2) == AT
    assert floors.floor("other", began + REWIND_EVERY / 2) is None  # no floor of its own yet
    assert floors.floor("q", began + REWIND_EVERY) is None


def test_after_an_empty_claim_from_the_floor_a_rewind_comes_as_soon_as_its_cost_allows() -> None:
    floors = started()
    began = rewound(floors, 0.002)  # 2 ms: the next may come 0.2 s after it
    assert floors.floor("q", began + 0.1, empty=True) == AT
    assert floors.floor("q", began + 0.3, empty=True) is None
    assert floors.floor("q", began + 0.3) == AT  # a worker taking jobs: a second apart


def test_a_slow_rewind_puts_the_next_one_further_off_so_rewinds_cost_a_bounded_share() -> None:
    floors = started()
    for _ in range(3):
        began = rewound(floors, 0.5)  # half a second, as under a long-held horizon
    for empty in (False, True):
        assert floors.floor("q", began + 0.5 * REWIND_SHARE - 0.1, empty=empty) == AT
        assert floors.floor("q", began + 0.5 * REWIND_SHARE + 1.0, empty=empty) is None


def test_a_first_slow_claim_and_one_slow_rewind_do_not_put_the_next_rewinds_off() -> None:
    floors = Floors()
    began = time.monotonic() - 1.0  # a process's first claim: cold caches
    floors.claimed("q", began, Claim([], floor=AT), None)
    assert floors.floor("q", began + 1.01, empty=True) is None
    for took in (0.001, 0.002, 0.5):  # the last one stalled
        began = rewound(floors, took)
    assert floors.floor("q", began + 0.05, empty=True) == AT
    assert floors.floor("q", began + 0.2, empty=True) is None  # 100 x 1 ms, not x 0.5 s


def test_a_claim_that_says_no_floor_changes_nothing_and_rewind_forces_the_next() -> None:
    floors = started()
    began = rewound(floors, 0.0)
    floors.claimed("q", began + 0.1, Claim([]), AT)  # the general claim, under limits: none
    assert floors.floor("q", began + 0.2) == AT
    floors.rewind()
    assert floors.floor("q", began + 0.2) is None
