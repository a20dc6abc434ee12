"""A child's shared job counters, read by its parent across a real fork: what grew, an
unanswered group commit, and garbage that must not take the parent down."""

from __future__ import annotations

import os

from forklift import shared_counts
from forklift.shared_counts import SharedCounts


def in_child(counts: SharedCounts, work: object) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            work(counts)  # type: ignore[operator]
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_the_parent_reads_what_its_child_counted_once() -> None:
    counts = SharedCounts()

    def work(c: SharedCounts) -> None:
        for _ in range(3):
            c.add(("default", "noop", "succeeded"))
        c.add(("q", "t", "dead"), 2)

    in_child(counts, work)
    grown, bad = counts.changes()
    assert sorted(grown) == [["default", "noop", "succeeded", 3], ["q", "t", "dead", 2]]
    assert bad == 0
    assert counts.changes() == ([], 0)  # nothing new: nothing added twice
    assert counts.pending() == []


def test_an_unanswered_group_commit_is_left_for_the_parent_to_settle() -> None:
    counts = SharedCounts()
    key = ("default", "noop", "succeeded")

    def sent_and_killed(c: SharedCounts) -> None:
        assert c.intend([(11, 1, key), (12, 3, key)])

    in_child(counts, sent_and_killed)
    assert counts.pending() == [(11, 1, key), (12, 3, key)]

    answered = SharedCounts()

    def answered_then_killed(c: SharedCounts) -> None:
        c.intend([(11, 1, key)])
        c.answered()  # the child counts it itself from here on

    in_child(answered, answered_then_killed)
    assert answered.pending() == []


def test_garbage_in_the_region_is_dropped_and_counted_as_malformed() -> None:
    counts = SharedCounts()

    def scribble(c: SharedCounts) -> None:
        c.add(("default", "noop", "succeeded"))
        start = 8 + 10
        c.region[start : start + 20] = b"\xff" * 20  # the first key: not UTF-8 JSON
        shared_counts._U64.pack_into(c.region, 0, 10**9)  # slots in use: out of range

    in_child(counts, scribble)
    grown, bad = counts.changes()
    assert grown == [] and bad >= 2
    counts.add(("x", "y", "succeeded"))  # and it still works (the parent's own writes)


def test_a_full_table_says_so_and_the_count_goes_elsewhere() -> None:
    counts = SharedCounts()
    for i in range(shared_counts.SLOTS):
        assert counts.add(("q", f"t{i}", "succeeded"))
    assert not counts.add(("q", "one-more", "succeeded"))
    assert not counts.intend([(1, 1, ("q", "another", "succeeded"))])
