"""Holdings: which jobs a worker holds and how many slots they take (no database)."""

from __future__ import annotations

from typing import cast

from forklift.store import ClaimedJob, JobStore
from forklift.workers.context import JobContext
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


def test_a_failed_give_back_hands_back_the_jobs_an_executor_passed_over() -> None:
    """A give-back whose statement failed keeps its jobs; one an executor skipped while
    it was being given back must be queued again, or its slot would be held for good
    (seen under a database outage: a worker stuck with every slot taken, running none)."""
    h = Holdings(concurrency=1)
    a, b = held(1), held(2)
    h.adopt(a)
    h.adopt(b)
    assert h.take_waiting() == [a, b]
    assert not h.start(a, 1.0)  # dequeued while taken: passed over
    assert h.keep_waiting([a, b]) == [a]  # b is still in the queue: not again
    assert h.start(a, 2.0) and h.start(b, 2.0)
