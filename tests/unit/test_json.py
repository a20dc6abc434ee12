"""Job arguments: what `_json` accepts, what it refuses, and where it says the problem is."""

from __future__ import annotations

import datetime
import decimal
import json
import math
import types
import uuid
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import forklift
from forklift import _json


def nested(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "args",
    [
        {},
        {"n": None, "t": True, "f": False, "i": 0, "big": 10**30, "neg": -7, "x": 1.5},
        {"s": "", "uni": "héllo wörld ✓ 日本語 🚚", "rtl": "שלום", "ctl": "tab\there\nnewline"},
        {"a": {"b": ["x", 1, 2.5, None, {"c": [[], {}]}]}},
        {"ключ": "значение", "🔑": ["🚚"]},
        {"tiny": 5e-324, "huge": 1.7976931348623157e308, "negzero": -0.0},
    ],
)
def test_accepts_json_values(args: dict[str, Any]) -> None:
    _json.check(args)
    assert json.loads(_json.dumps_args(args)) == args


def test_tuples_are_encoded_as_lists() -> None:
    assert json.loads(_json.dumps_args({"t": (1, (2, 3))})) == {"t": [1, [2, 3]]}


def test_unicode_is_kept_as_is_not_escaped() -> None:
    # ensure_ascii=False: jsonb stores the characters, not \\u escapes of them.
    assert _json.dumps_args({"k": "é🚚"}) == '{"k":"é🚚"}'


def test_any_mapping_is_accepted_not_only_dict() -> None:
    # dumps_args and check both take a Mapping; a read-only mapping is still a mapping.
    args = types.MappingProxyType({"a": types.MappingProxyType({"b": 1})})
    assert json.loads(_json.dumps_args(args)) == {"a": {"b": 1}}


@pytest.mark.parametrize(
    ("args", "where", "why"),
    [
        ({"a": {"b": ["x", "\x00"]}}, "['a']['b'][1]", "NUL"),
        ({"a": "before\x00after"}, "['a']", "NUL"),
        ({"a": {"b\x00": 1}}, "['a']", "NUL"),
        ({"\x00": 1}, "args", "NUL"),
        ({"x": [1, float("nan")]}, "['x'][1]", "nan"),
        ({"x": {"y": float("inf")}}, "['x']['y']", "inf"),
        ({"x": -math.inf}, "['x']", "-inf"),
        ({"x": {1: "one"}}, "['x']", "key 1"),
        ({"x": {None: "none"}}, "['x']", "key None"),
        ({"x": {("a", "b"): 1}}, "['x']", "not a string"),
        ({"x": [{1, 2}]}, "['x'][0]", "set"),
        ({"x": frozenset()}, "['x']", "frozenset"),
        ({"x": b"bytes"}, "['x']", "bytes"),
        ({"x": bytearray(b"b")}, "['x']", "bytearray"),
        ({"x": datetime.datetime(2024, 1, 1)}, "['x']", "datetime"),
        ({"x": datetime.date(2024, 1, 1)}, "['x']", "date"),
        ({"x": decimal.Decimal("1.5")}, "['x']", "Decimal"),
        ({"x": uuid.UUID(int=0)}, "['x']", "UUID"),
        ({"x": object()}, "['x']", "object"),
        ({"x": {"y": [len]}}, "['x']['y'][0]", "builtin_function_or_method"),
        ({"x": "lone \ud800 surrogate"}, "['x']", "Unicode"),
        ({"x": ["ok", "\udfff"]}, "['x'][1]", "Unicode"),
    ],
)
def test_refuses_with_the_key_path(args: dict[Any, Any], where: str, why: str) -> None:
    with pytest.raises(forklift.ArgumentError) as info:
        _json.dumps_args(args)
    message = str(info.value)
    assert message.startswith(f"{where}:"), message
    assert why in message, message


def test_refuses_a_lone_surrogate_in_a_key() -> None:
    # A surrogate cannot be encoded as UTF-8: PostgreSQL would never receive this text.
    with pytest.raises(forklift.ArgumentError) as info:
        _json.dumps_args({"a": {"bad \ud800 key": 1}})
    assert "['a']" in str(info.value)


def test_argument_error_is_a_value_error_and_a_forklift_error() -> None:
    with pytest.raises(ValueError):
        _json.dumps_args({"x": float("nan")})
    with pytest.raises(forklift.ForkliftError):
        _json.dumps_args({"x": float("nan")})


def test_reports_the_first_problem_in_order() -> None:
    with pytest.raises(forklift.ArgumentError, match=r"^\['a'\]\[0\]:"):
        _json.dumps_args({"a": [float("nan"), "\x00"], "b": object()})


def test_nesting_within_the_limit_is_accepted() -> None:
    args = {"d": nested(_json._MAX_DEPTH - 1)}
    assert json.loads(_json.dumps_args(args)) == args


@pytest.mark.parametrize("levels", [_json._MAX_DEPTH + 1, _json._MAX_DEPTH + 5, 10_000])
def test_too_deep_nesting_is_refused_before_recursion_fails(levels: int) -> None:
    # 10,000 levels would blow Python's recursion limit in json.dumps: check must stop first.
    with pytest.raises(forklift.ArgumentError, match=f"deeper than {_json._MAX_DEPTH}"):
        _json.dumps_args({"d": nested(levels)})


@pytest.mark.parametrize("args", [[1, 2], ("a", 1), "text", 1, None, b"{}", '{"a": 1}', {("k",)}])
def test_top_level_must_be_a_mapping(args: Any) -> None:
    with pytest.raises(forklift.ArgumentError, match="expected a dict of keyword arguments"):
        _json.dumps_args(args)


def test_top_level_key_must_be_a_string() -> None:
    with pytest.raises(forklift.ArgumentError, match="key 1 is not a string"):
        _json.dumps_args({1: "x"})  # type: ignore[dict-item]


# -- property: whatever JSON can hold round-trips ----------------------------------------

_text = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))
_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text
)
_json_values = st.recursive(
    _leaves,
    lambda children: st.lists(children, max_size=5) | st.dictionaries(_text, children, max_size=5),
    max_leaves=30,
)


@given(_json_values)
def test_any_json_value_round_trips(value: Any) -> None:
    text = _json.dumps_args({"v": value})
    assert json.loads(text) == {"v": value}
    # What dumps_args returns must be sendable to PostgreSQL as UTF-8 text.
    text.encode("utf-8")


@given(_json_values)
def test_the_encoder_built_once_writes_what_json_dumps_writes(value: Any) -> None:
    # _json keeps one C encoder instead of json's new one per call: the same text.
    wanted = json.dumps({"v": value}, separators=(",", ":"), ensure_ascii=False)
    assert _json.dumps_args({"v": value}) == wanted
    assert _json.dumps_result(value, 10**9) == json.dumps(
        value, separators=(",", ":"), ensure_ascii=False
    )
