"""Holdings: which jobs a worker holds and how many slots they take (no database)."""

from __future__ import annotations

import random
from typing import cast

from forklift.store import ClaimedJob, JobStore
from forklift.workers.context import JobContext, Stage, Writing
from forklift.workers.holdings import Holdings


def held(job_id: int) -> JobContext:
    job = ClaimedJob(job_id, "default", "noop", {}, None, 0, 1, 5, None)
    return JobContext(job, cast(JobStore, None))  # never opens a transaction here


def test_a_slot_frees_when_the_handler_returns_but_the_job_stays_held() -> None:
    h = Holdings(concurrency=2)
    a, b = held(1), held(2)
    h.adopt(a)
    h.adopt(b)
    assert h.free() == (0, 2)
    assert h.free_slot(a)
    assert not h.free_slot(a)  # once only
    assert h.free() == (1, 2)  # a awaits its group commit, still held
    assert h.running() == [b]
    h.end(a)
    assert h.free() == (1, 1) and h.ended == 1


def test_held_jobs_awaiting_completion_cap_new_claims_at_twice_the_slots() -> None:
    h = Holdings(concurrency=2)
    for i in range(4):
        ctx = held(i)
        h.adopt(ctx)
        h.free_slot(ctx)
    assert h.free() == (0, 4)  # every slot idle, but four completions outstanding


def test_completions_written_with_the_claim_do_not_cap_it() -> None:
    """The claim's own transaction writes these completions: once it has claimed they
    are no longer held, so they leave room for it."""
    h = Holdings(concurrency=2)
    for i in range(4):
        ctx = held(i)
        h.adopt(ctx)
        h.free_slot(ctx)
    assert h.free() == (0, 4)
    assert h.free(leaving=1) == (1, 4)  # three still outstanding, of four allowed
    assert h.free(leaving=4) == (2, 4)  # the slots themselves cap it
    assert h.free(ahead=10, leaving=4) == (12, 4)


def test_a_release_forgets_the_job_without_counting_it() -> None:
    h = Holdings(concurrency=1)
    ctx = held(7)
    h.adopt(ctx)
    assert h.release(ctx)
    assert len(h) == 0 and h.ended == 0 and h.free() == (1, 0)
    assert not h.release(ctx)


def test_end_forgets_only_the_context_it_is_given() -> None:
    h = Holdings(concurrency=2)
    old, new = held(9), held(9)  # the same job, claimed again after its lease expired
    h.adopt(old)
    h.adopt(new)
    h.end(old)
    assert h.snapshot() == [new]


def test_a_failed_release_hands_back_the_jobs_an_executor_passed_over() -> None:
    """A release whose statement failed keeps its jobs; one an executor skipped while
    it was being released must be queued again, or its slot would be held for good
    (seen under a database outage: a worker stuck with every slot taken, running none)."""
    h = Holdings(concurrency=1)
    a, b = held(1), held(2)
    h.adopt(a)
    h.adopt(b)
    assert h.take_waiting() == [a, b]
    assert not h.start(a, 1.0)  # dequeued while taken: passed over
    assert h.untake([a, b]) == [a]  # b is still in the queue: not again
    assert h.start(a, 2.0) and h.start(b, 2.0)


def test_an_outcome_is_taken_by_one_thread_only() -> None:
    """Whoever takes a job's outcome first writes it: a handler returning while the stop
    releases its job finds it taken, and a release that failed lets it go again."""
    h = Holdings(concurrency=2)
    a, b = held(1), held(2)
    h.adopt(a)
    h.adopt(b)
    assert h.start(a, 1.0)
    assert h.take([b]) == [b]  # b's outcome is being written
    assert h.take_running() == [a]  # the stop takes a to release it; b is not its own
    assert h.take([a, b]) == []  # a's handler returns: not its to write
    assert h.untake([a]) == []  # the release failed: a ran, no executor passed it over
    assert h.take([a]) == [a] and h.take_running() == []


def test_the_waiting_and_running_counts_agree_with_the_jobs_held() -> None:
    # Holdings keeps how many jobs wait for a slot and which run as they change; here
    # every step of a random mix of claims, starts, returns, ends, releases and
    # releases is checked against a count from the jobs themselves.
    rng = random.Random(7)
    for _ in range(50):
        h = Holdings(concurrency=3)
        contexts: list[JobContext] = []
        gone: set[int] = set()  # ids (of the contexts) ended or released
        for step in range(200):
            op = rng.choice(["adopt", "start", "return", "end", "release", "take", "keep"])
            live = [c for c in contexts if id(c) not in gone]
            pick = rng.choice(live) if live else None
            if op == "adopt" or pick is None:
                # Now and then a job released is claimed again: same id, new context.
                job_id = (
                    rng.choice([c.job_id for c in contexts])
                    if contexts and rng.random() < 0.1
                    else step
                )
                ctx = held(job_id)
                contexts.append(ctx)
                h.adopt(ctx)
            elif op == "start":
                h.start(pick, float(step))
            elif op == "return":
                h.free_slot(pick)
            elif op == "end":
                h.end(pick)
                gone.add(id(pick))
            elif op == "release":
                h.release(pick)
                gone.add(id(pick))
            elif op == "take":
                h.untake(h.take_waiting()) if rng.random() < 0.5 else h.take_waiting()
            else:
                h.untake([c for c in contexts if c.writing is Writing.TAKEN])
            jobs = h.snapshot()
            waiting = (Stage.WAITING, Stage.PASSED)
            assert h.waiting() == sum(1 for c in jobs if c.stage in waiting)
            running = [c for c in jobs if c.stage is Stage.RUNNING]
            assert h.longest_running(1000.0) == max(
                (1000.0 - c.started_at for c in running), default=0.0
            )
