"""What the flags of `forklift queues limit` parse to, and how limits read."""

from __future__ import annotations

import argparse

import pytest

from forklift.admin import LimitChange, LimitRow, QueueStats
from forklift.cli import limits
from forklift.cli.errors import UsageError


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("10/s", (10, 1.0)),
        ("100/60s", (100, 60.0)),
        ("5/m", (5, 60.0)),
        ("500/h", (500, 3600.0)),
        ("3/2m", (3, 120.0)),
        ("1/0.5s", (1, 0.5)),
        ("none", None),
        ("NONE", None),
    ],
)
def test_a_rate_is_starts_per_seconds(text: str, parsed: tuple[int, float] | None) -> None:
    assert limits.rate(text) == parsed


@pytest.mark.parametrize(
    "text", ["10/x", "10", "0/s", "-1/s", "10/0s", "1.5/s", "10/ s", "/s", "", "2147483648/s"]
)
def test_a_bad_rate_says_what_is_expected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=r"expected N/s, N/Ns, N/m or N/h"):
        limits.rate(text)


@pytest.mark.parametrize("text", ["0", "-3", "2.5", "four", "", "2147483648"])
def test_a_count_is_a_whole_number_from_one(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match="or none to remove this limit"):
        limits.count(text)
    assert limits.count("7") == 7 and limits.count("none") is None


def namespace(**given: object) -> argparse.Namespace:
    return argparse.Namespace(clear=False, **given)


def test_only_the_flags_given_change_and_none_removes_one() -> None:
    change = limits.change_of(namespace(rate=(100, 60.0), max_depth=None))
    assert change is not None and change == LimitChange(
        frozenset({"rate", "max_depth"}), None, 100, 60.0, None
    )
    assert change.params("q") == {
        "queue": "q", "concurrency": None, "rate": 100, "per": 60.0, "max_depth": None,
        "set_concurrency": False, "set_rate": True, "set_max_depth": True,
    }  # fmt: skip
    removed = limits.change_of(namespace(rate=None))
    assert removed is not None and removed.params("q")["per"] is None


def test_nothing_to_set_or_clear_with_a_limit_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="nothing to set"):
        limits.change_of(namespace())
    with pytest.raises(UsageError, match="give it alone"):
        limits.change_of(argparse.Namespace(clear=True, concurrency=3))
    assert limits.change_of(argparse.Namespace(clear=True)) is None


def test_limits_read_as_forklift_limit_describes_them() -> None:
    charge = LimitRow("task", "charge", 1, None, None, keyed=True, key_arg="account")
    assert charge.describe() == "concurrency 1 per account"
    by_callable = LimitRow("task", "t", None, 10, 1.0, keyed=True)
    assert by_callable.describe() == "10/1s per key"
    queue = LimitRow("queue", "emails", 4, 10, 1.0, max_depth=10000)
    assert limits.in_force("emails", queue) == "emails: concurrency 4, 10/1s, max depth 10000"
    assert limits.in_force("emails", None) == "emails: no limits"
    assert limits.task_lines([queue, charge]) == ["task charge: concurrency 1 per account"]
    assert limits.cell(QueueStats("q", 0, 0, 0, 0, None, max_depth=5, rejected=3)) == (
        "max depth 5 (3 rejected)"
    )
    assert limits.cell(QueueStats("q", 0, 0, 0, 0, None)) == "-"
