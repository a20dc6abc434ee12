"""The report pipe's decoder under hypothesis: any bytes, any split, nothing raises; any
valid reports, split anywhere, come out as they went in."""

from __future__ import annotations

import os
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from forklift.metrics import Totals
from forklift.supervisor.child import Child
from forklift.supervisor.reports import (
    Heartbeat,
    JobEnded,
    JobStarted,
    MetricDeltas,
    Report,
    ReportDecoder,
    encode,
    parse_line,
)

# Any character at all, lone surrogates and control characters included.
ANY_TEXT = st.text(st.characters(exclude_categories=()), max_size=200)
JSON: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | ANY_TEXT,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(ANY_TEXT, inner, max_size=5),
    max_leaves=20,
)
IDS = st.integers(min_value=0, max_value=2**63)
REPORTS: st.SearchStrategy[Report] = st.one_of(
    st.builds(Heartbeat, IDS, IDS),
    st.builds(
        JobStarted,
        IDS,
        st.none() | st.floats(min_value=1e-6, max_value=1e12),
        ANY_TEXT,
    ),
    st.builds(JobEnded, IDS),
    st.builds(MetricDeltas, st.dictionaries(ANY_TEXT, JSON, max_size=5)),
)
FUZZ = settings(deadline=None, max_examples=200)


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given points (taken modulo its length, in order)."""
    points = sorted({c % (len(data) + 1) for c in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)], strict=True)]


@FUZZ
@given(st.binary(max_size=4000), st.lists(st.integers(min_value=0), max_size=20))
def test_any_bytes_split_anywhere_never_raise(data: bytes, cuts: list[int]) -> None:
    decoder = ReportDecoder(max_line=512)
    for piece in split(data, cuts):
        decoded = decoder.feed(piece)
        assert all(isinstance(r, Report) for r in decoded.reports)
        assert decoder.partial <= 512
    decoder.close()
    assert decoder.partial == 0


@FUZZ
@given(st.lists(REPORTS, max_size=30), st.lists(st.integers(min_value=0), max_size=30))
def test_valid_reports_split_anywhere_round_trip(reports: list[Report], cuts: list[int]) -> None:
    stream = b"".join(encode(r) for r in reports)
    assert stream.isascii()
    assert stream.count(b"\n") == len(reports)  # one line each, whatever the payload
    decoder = ReportDecoder()
    got: list[Report] = []
    for piece in split(stream, cuts):
        decoded = decoder.feed(piece)
        assert decoded.malformed == []
        got += decoded.reports
    assert got == reports
    assert decoder.close().malformed == []


GARBAGE_LINE = st.binary(max_size=300).filter(lambda g: b"\n" not in g and parse_line(g) is None)


@FUZZ
@given(
    st.lists(st.tuples(GARBAGE_LINE, REPORTS), max_size=15),
    st.lists(st.integers(min_value=0), max_size=20),
)
def test_garbage_costs_only_its_own_line(
    pairs: list[tuple[bytes, Report]], cuts: list[int]
) -> None:
    stream = b"".join(garbage + b"\n" + encode(report) for garbage, report in pairs)
    decoder = ReportDecoder()
    got: list[Report] = []
    malformed = 0
    for piece in split(stream, cuts):
        decoded = decoder.feed(piece)
        got += decoded.reports
        malformed += len(decoded.malformed)
    assert got == [report for _, report in pairs]
    assert malformed == len(pairs)


@FUZZ
@given(st.binary(max_size=3000))
def test_nothing_a_child_writes_raises_in_the_parent(data: bytes) -> None:
    read_fd, write_fd = os.pipe()
    os.set_blocking(read_fd, False)
    totals = Totals()
    child = Child(1, 1, "h:1:a", read_fd, 0.0, 0.0, on_metrics=totals.add)
    try:
        os.write(write_fd, data)
        child.read(1.0)
        os.close(write_fd)
        assert child.read(2.0) is False
    finally:
        child.close()
        try:
            os.close(write_fd)
        except OSError:
            pass


@FUZZ
@given(st.lists(st.tuples(IDS, st.floats(), st.integers(), ANY_TEXT), max_size=5))
def test_any_metric_deltas_either_add_up_or_are_refused_whole(rows: list[Any]) -> None:
    totals = Totals()
    jobs = [[t, t, t, n if i % 2 else f] for i, (_, f, n, t) in enumerate(rows)]
    deltas = {"jobs": jobs, "renewals": rows[0][0] if rows else 0}
    try:
        totals.add(deltas)
    except ValueError:
        assert totals.jobs == {} and totals.renewals == 0
    else:
        assert all(n >= 0 for n in totals.jobs.values())
