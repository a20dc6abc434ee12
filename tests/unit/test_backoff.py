"""Retry delays: exponential growth, the cap, bounded jitter, refusal of nonsense settings."""

from __future__ import annotations

import math
import random

import pytest

from forklift import Backoff


def test_grows_exponentially_without_jitter() -> None:
    b = Backoff(base=1.0, factor=2.0, max=1e9, jitter=0)
    assert [b.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 16, 32, 64]


def test_base_and_factor_are_used() -> None:
    b = Backoff(base=0.5, factor=3.0, max=1e9, jitter=0)
    assert [b.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.5, 4.5, 13.5]


def test_factor_one_is_a_constant_delay() -> None:
    b = Backoff(base=7.0, factor=1.0, max=60, jitter=0)
    assert {b.delay(n) for n in range(1, 50)} == {7.0}


def test_jitter_zero_is_exact_and_ignores_the_rng() -> None:
    b = Backoff(base=3.0, factor=2.0, max=1000, jitter=0)
    for seed in range(20):
        assert b.delay(4, random.Random(seed)) == 24.0


def test_capped_at_max() -> None:
    b = Backoff(base=1.0, factor=2.0, max=100.0, jitter=0)
    assert b.delay(7) == 64.0
    assert b.delay(8) == 100.0
    assert b.delay(50) == 100.0


def test_zero_base_never_waits() -> None:
    b = Backoff(base=0.0, factor=2.0, max=10, jitter=0.5)
    assert {b.delay(n, random.Random(n)) for n in range(1, 100)} == {0.0}


@pytest.mark.parametrize("jitter", [0.01, 0.2, 0.5, 0.99])
def test_jitter_stays_within_bounds(jitter: float) -> None:
    b = Backoff(base=1.0, factor=2.0, max=3600.0, jitter=jitter)
    rng = random.Random(1234)
    for attempt in range(1, 30):
        nominal = min(b.max, b.base * b.factor ** (attempt - 1))
        for _ in range(200):
            d = b.delay(attempt, rng)
            assert nominal * (1 - jitter) <= d <= nominal * (1 + jitter), (attempt, d)
            assert 0 <= d <= b.max


def test_jitter_actually_spreads_delays_on_both_sides() -> None:
    b = Backoff(base=10.0, factor=2.0, max=3600.0, jitter=0.2)
    rng = random.Random(7)
    delays = [b.delay(1, rng) for _ in range(500)]
    assert min(delays) < 9.0 and max(delays) > 11.0
    assert len(set(delays)) > 400


def test_same_seed_same_delays() -> None:
    b = Backoff(jitter=0.3)
    first = [b.delay(n, random.Random(42)) for n in range(1, 20)]
    second = [b.delay(n, random.Random(42)) for n in range(1, 20)]
    assert first == second


@pytest.mark.parametrize(
    "kwargs",
    [
        {"base": -1.0},
        {"factor": 0.5},
        {"factor": 0.0},
        {"max": -1.0},
        {"jitter": -0.1},
        {"jitter": 1.0},
        {"jitter": 1.5},
    ],
)
def test_invalid_settings_raise_value_error(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Backoff(**kwargs)


@pytest.mark.parametrize("field", ["base", "factor", "max", "jitter"])
def test_nan_settings_raise_value_error(field: str) -> None:
    # NaN compares false with everything, so `x < 0` style checks let it through;
    # Backoff(max=nan) would then retry with a 0 s delay.
    with pytest.raises(ValueError):
        Backoff(**{field: math.nan})


@pytest.mark.parametrize("attempt", [65, pytest.param(10**100, id="1e100")])
@pytest.mark.parametrize(
    "factor",
    [2.0, 10.0, 1000.0, pytest.param(1e6, id="1e6"), pytest.param(10**6, id="int-10**6")],
)
def test_huge_attempts_do_not_overflow(attempt: int, factor: float) -> None:
    b = Backoff(base=1.0, factor=factor, max=600.0, jitter=0.1)
    d = b.delay(attempt, random.Random(0))
    assert math.isfinite(d)
    assert 600.0 * 0.9 <= d <= 600.0


def test_attempt_before_the_first_is_not_shorter_than_base() -> None:
    b = Backoff(base=5.0, factor=2.0, max=100.0, jitter=0)
    assert b.delay(0) >= 5.0
    assert b.delay(-3) >= 5.0
