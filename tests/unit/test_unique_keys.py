"""Unique keys as stored (forklift/unique.py): a job's key is in the database, so the
same task, declaration and values must make the same key in every version; a change of
its text would let a job enqueued after an upgrade miss the live job holding its key."""

from __future__ import annotations

import pytest

import forklift
from forklift.errors import ArgumentError


def test_a_key_is_the_same_in_every_version() -> None:
    # Computed once with json.JSONEncoder(sort_keys=True, separators=(",", ":"),
    # ensure_ascii=False, allow_nan=False).encode, as the first version stored them.
    by_keys = forklift.Unique(keys=["account", "day"], period=60)
    given = {"account": "é-1", "day": {"y": 2026, "m": [12, 7.5]}, "x": 1}
    assert by_keys.key_of("render", given, {}) == (
        "7b789dee6572bf06c116ceff4b9b74ee80a4f4f9311653686b6f2b877f48cadb"
    )
    every_arg = forklift.Unique()
    assert every_arg.key_of("render", {"b": None, "a": True}, {"c": 3}) == (
        "389e7ccb40a51d5ad7263b62974bc0092129bb8f8a77336349dc5492a3ae0635"
    )


def test_the_order_of_arguments_makes_no_other_key() -> None:
    unique = forklift.Unique()
    assert unique.key_of("t", {"a": 1, "b": {"y": 2, "x": 1}}, {}) == unique.key_of(
        "t", {"b": {"x": 1, "y": 2}, "a": 1}, {}
    )


@pytest.mark.parametrize("value", [float("nan"), object()])
def test_a_value_that_is_not_json_is_an_argument_error(value: object) -> None:
    with pytest.raises(ArgumentError, match="unique key's values"):
        forklift.Unique(keys=["n"]).key_of("t", {"n": value}, {})


def test_a_default_nested_in_itself_is_an_argument_error() -> None:
    looped: list[object] = []
    looped.append(looped)
    with pytest.raises(ArgumentError, match="unique key's values"):
        forklift.Unique(keys=["n"]).key_of("t", {}, {"n": looped})
