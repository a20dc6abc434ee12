"""A child's SharedTally, read by its parent across a real fork: what grew, an
unanswered group commit, and garbage that must not take the parent down."""

from __future__ import annotations

import os
import random
from collections import Counter

from forklift import shared_tally
from forklift.shared_tally import SharedTally


def in_child(counts: SharedTally, work: object) -> None:
    pid = os.fork()
    if pid == 0:
        try:
            work(counts)  # type: ignore[operator]
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def test_the_parent_reads_what_its_child_counted_once() -> None:
    counts = SharedTally()

    def work(c: SharedTally) -> None:
        for _ in range(3):
            c.add(("default", "noop", "succeeded"))
        c.add(("q", "t", "dead"), 2)

    in_child(counts, work)
    grown, bad = counts.changes()
    assert sorted(grown) == [["default", "noop", "succeeded", 3], ["q", "t", "dead", 2]]
    assert bad == 0
    assert counts.changes() == ([], 0)  # nothing new: nothing added twice
    assert counts.unanswered() == []


def test_an_unanswered_group_commit_is_left_for_the_parent_to_settle() -> None:
    counts = SharedTally()
    key = ("default", "noop", "succeeded")

    def sent_and_killed(c: SharedTally) -> None:
        assert c.intend([(11, 1, key), (12, 3, key)])

    in_child(counts, sent_and_killed)
    assert counts.unanswered() == [(11, 1, key), (12, 3, key)]

    counted = SharedTally()

    def counted_then_killed(c: SharedTally) -> None:
        c.intend([(11, 1, key), (12, 3, key)])
        c.fold({key: 1})  # one of the two succeeded, and the child counted it

    in_child(counted, counted_then_killed)
    assert counted.unanswered() == []
    assert counted.changes() == ([[*key, 1]], 0)


def test_a_kill_in_the_middle_of_a_fold_leaves_only_the_unfolded_slots_to_settle() -> None:
    """A group commit of two tasks, killed after the first slot took its count and
    before the second did: the parent asks about the second task's jobs alone, and the
    first task's count arrives once, from its slot."""
    counts = SharedTally()
    a, b = ("default", "a", "succeeded"), ("default", "b", "succeeded")

    def killed_mid_fold(c: SharedTally) -> None:
        c.add(a, 5)  # counted before: kept through the intent's marks
        assert c.intend([(1, 1, a), (2, 1, b), (3, 1, a)])
        c.add(b)  # another thread's count while the statement runs
        generation, slots = c._intent or (0, {})
        c._bump(slots[a], 2, generation=generation)  # fold() got this far

    in_child(counts, killed_mid_fold)
    assert counts.unanswered() == [(2, 1, b)]
    grown, bad = counts.changes()
    assert sorted(grown) == [[*a, 7], [*b, 1]] and bad == 0


def test_counts_survive_many_intents_and_their_marks() -> None:
    counts = SharedTally()
    key = ("q", "t", "succeeded")
    for i in range(2000):
        assert counts.intend([(i, 1, key)])
        counts.add(key)
        counts.fold({key: 1})
    assert counts.unanswered() == []
    assert counts.changes() == ([[*key, 4000]], 0)


def test_garbage_in_the_region_is_dropped_and_counted_as_malformed() -> None:
    counts = SharedTally()

    def scribble(c: SharedTally) -> None:
        c.add(("default", "noop", "succeeded"))
        start = 8 + 10
        c.region[start : start + 20] = b"\xff" * 20  # the first key: not UTF-8 JSON
        c._words[0] = 10**9  # slots in use: out of range

    in_child(counts, scribble)
    grown, bad = counts.changes()
    assert grown == [] and bad >= 2
    counts.add(("x", "y", "succeeded"))  # and it still works (the parent's own writes)


def test_a_full_table_says_so_and_the_count_goes_elsewhere() -> None:
    counts = SharedTally()
    for i in range(shared_tally.SLOTS):
        assert counts.add(("q", f"t{i}", "succeeded"))
    assert not counts.add(("q", "one-more", "succeeded"))
    assert not counts.intend([(1, 1, ("q", "another", "succeeded"))])


def _hammer(c: SharedTally, rounds: int) -> Counter[tuple[str, str, str]]:
    """What a busy child does: single outcomes, and group commits intended and folded
    (seeded: the parent replays it for the totals)."""
    rng = random.Random(7)
    keys = [("default", f"t{i}", o) for i in range(5) for o in ("succeeded", "failed")]
    total: Counter[tuple[str, str, str]] = Counter()
    for _ in range(rounds):
        if rng.random() < 0.5:
            key = rng.choice(keys)
            c.add(key)
            total[key] += 1
        else:
            jobs = [(i, 1, rng.choice(keys)) for i in range(rng.randint(1, 20))]
            folded = Counter(k for _, _, k in jobs if rng.random() < 0.9)
            c.intend(jobs)
            c.fold(folded)
            total += folded
    return total


def test_a_parent_reading_while_its_child_counts_never_sees_a_count_go_back() -> None:
    # struct's pack_into zeroes a word before writing it: a reader between the two saw
    # a count of 0 (about one read in a hundred here) and called the counters malformed.
    counts = SharedTally()
    rounds = 100_000
    pid = os.fork()
    if pid == 0:
        try:
            _hammer(counts, rounds)
        finally:
            os._exit(0)
    added: Counter[tuple[str, str, str]] = Counter()
    reads = bad = 0
    while True:
        exited = os.waitpid(pid, os.WNOHANG)[0] != 0
        grown, malformed = counts.changes()
        reads += 1
        bad += malformed
        for queue, task, outcome, n in grown:
            added[(str(queue), str(task), str(outcome))] += int(n)  # type: ignore[call-overload]
        if exited:
            break
    assert bad == 0, f"{bad} of {reads} reads saw a count go back"
    assert reads > 100  # it did read while the child counted
    assert added == _hammer(SharedTally(), rounds)
