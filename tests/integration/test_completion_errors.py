"""A group completion with one bad row among good ones, against a
real PostgreSQL: only the bad row fails, saying why; the rest succeed; a data error is
never retried as if the database were away."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

import forklift
from forklift.errors import DatabaseError
from forklift.metrics import Tally
from forklift.shared_tally import SharedTally
from forklift.store import Claim, Completion, JobState
from forklift.store.limits import LimitStore
from forklift.testing import wait_for
from forklift.workers.claimer import Claimer
from forklift.workers.completer import Completer, CompleterConfig
from forklift.workers.context import JobContext
from forklift.workers.events import JobEvents, Outcome
from forklift.workers.progress import ProgressWriter
from forklift.workers.recorder import Recorder
from forklift.workers.renewer import LeaseRenewer, RenewerConfig
from tests.integration.conftest import RunWorker
from tests.integration.test_worker_services import OWNER, Rig, open_rig, state

# A completer that retried a refused batch would retry it until this gave up: long
# enough that a retried data error shows in the statement count, short enough for a test.
CONFIG = CompleterConfig(give_up_after=3.0)

# What jsonb refuses, as JSON text: a NUL escape (22P05) and a lone surrogate (22P02).
BAD_JSON = ['"bad\\u0000"', '"\\udcff"']


@pytest.fixture
def rig(dsn: str, schema: str, app: forklift.App) -> Iterator[Rig]:
    with open_rig(dsn, schema, "test-completion-errors") as r:
        yield r


def counting(rig: Rig) -> list[int]:
    """Count the rows of each group completion the rig's store sends."""
    sent: list[int] = []
    complete = rig.store.job_complete_many

    def counted(done: Sequence[Completion], owner: str) -> set[int]:
        sent.append(len(done))
        return complete(done, owner)

    rig.store.job_complete_many = counted  # type: ignore[method-assign]
    return sent


def returned(rig: Rig, held: list[JobContext]) -> None:
    for ctx in held:
        rig.events.returned(ctx)


def claimer_of(rig: Rig, schema: str) -> Claimer:
    """A claimer of queue default for the rig's worker, reconciling its holdings."""
    limits = LimitStore(rig.store.pool, schema, rig.store.where)
    return Claimer(rig.store, limits, ["default"], {}, OWNER, 30.0, rig.holdings)


def error_of(db: psycopg.Connection[Any], schema: str, job_id: int) -> str:
    row = db.execute(f"SELECT last_error FROM {schema}.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


@pytest.mark.parametrize("bad", BAD_JSON)
def test_a_bad_result_among_good_rows_fails_alone_and_is_not_retried(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str, bad: str
) -> None:
    held = rig.claim(app, 79)
    poison = held[40]
    poison.result_json = bad
    returned(rig, held)
    sent = counting(rig)
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing, CONFIG)
    flushed = completer.flush(held)
    innocent = [c for c in held if c is not poison]
    innocent_done = sum(state(db, schema, c.job_id) == JobState.SUCCEEDED for c in innocent)
    assert innocent_done == 78, f"{78 - innocent_done} of 78 innocent jobs not completed"
    assert flushed.completed == {c.job_id for c in held} - {poison.job_id}
    assert state(db, schema, poison.job_id) == JobState.DEAD
    assert error_of(db, schema, poison.job_id).startswith("CompletionError: ")
    assert (poison.job_id, Outcome.DEAD) in rig.ended
    # Bisection: the whole batch, then two halves per level down to the bad row alone:
    # a handful of statements, not a retry every 50 ms to 1 s for the whole give-up time.
    assert len(sent) <= 2 * 7 + 1, sent
    assert len(rig.holdings) == 0


def test_a_bad_progress_costs_only_its_report_not_its_job(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    held = rig.claim(app, 9)
    bad = held[3]
    bad.final_progress = '{"done": 1, "total": 2, "message": "bad\\u0000"}'
    for ctx in held:
        if ctx is not bad:
            ctx.final_progress = '{"done": 2, "total": 2, "message": "ok"}'
    returned(rig, held)
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing, CONFIG)
    assert completer.flush(held).completed == {c.job_id for c in held}
    assert all(state(db, schema, c.job_id) == JobState.SUCCEEDED for c in held)
    rows = db.execute(
        f"SELECT id, progress->>'message' FROM {schema}.jobs WHERE id = ANY(%s)",
        ([c.job_id for c in held],),
    ).fetchall()
    assert {i: m for i, m in rows if i != bad.job_id} == {
        c.job_id: "ok" for c in held if c is not bad
    }


def test_a_claim_carrying_a_bad_row_is_made_again_without_it(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """Riding with a claim, a refused completion rolled the claim back too: taken again
    with the next claim it was refused again, claim after claim. The completions are
    written on their own (the bad row alone fails) and the claim made again."""
    held = rig.claim(app, 6)
    held[2].result_json = BAD_JSON[0]
    returned(rig, held)
    app.enqueue("noop", {})  # for the claim to take
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing, CONFIG)
    for ctx in held:
        completer.submit(ctx)

    def claim(rows: Sequence[Completion]) -> Claim:
        return rig.store.job_claim_next(rows, ["default"], OWNER, 5, 30.0, expired=False)

    made = completer.riding(claim)
    assert len(made.jobs) == 1
    assert [state(db, schema, c.job_id) for c in held] == [JobState.SUCCEEDED] * 2 + [
        JobState.DEAD
    ] + [JobState.SUCCEEDED] * 3


def test_hostile_progress_messages_fail_no_job(
    app: forklift.App, db: psycopg.Connection[Any], schema: str, run_worker: RunWorker
) -> None:
    """ctx.progress(1, 2, "bad\\x00") and a lone surrogate among ordinary jobs,
    group-committed together: no innocent job ends dead (a retried whole batch took 46
    of 79 down with them)."""
    ids = app.enqueue_many([("noop", {}) for _ in range(77)])
    hostile = app.enqueue_many(
        [("progress_says", {"which": "nul"}), ("progress_says", {"which": "surrogate"})]
    )
    run_worker(concurrency=8, lease=6.0)
    wait_for(
        lambda: (
            db.execute(
                f"SELECT count(*) FROM {schema}.jobs WHERE state IN ('succeeded', 'dead')"
            ).fetchone()
            == (79,)
        ),
        timeout=20,
        what="every job ended",
    )
    rows = db.execute(
        f"SELECT id, state::text, progress->>'message' FROM {schema}.jobs ORDER BY id"
    ).fetchall()
    assert [s for i, s, _ in rows if i in ids] == ["succeeded"] * 77
    assert {i: (s, m) for i, s, m in rows if i in hostile} == {
        hostile[0]: ("succeeded", "bad\\x00"),
        hostile[1]: ("succeeded", "é\\udcff"),
    }
    assert json.loads(json.dumps(rows))  # what was stored reads back as plain JSON


# -- statements whose answer was lost --------------------------------------------------


def test_a_completion_that_committed_with_its_answer_lost_is_counted_succeeded(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """The claim carrying successes commits, then its connection drops before the
    answer: taken again, the completions find the jobs not theirs any more. They are
    looked up (succeeded at their attempt) and counted succeeded, not lease lost."""
    held = rig.claim(app, 4)
    returned(rig, held)
    completer = Completer(rig.store, OWNER, rig.holdings, rig.events, rig.closing, CONFIG)
    completer.flushed.enable()
    for ctx in held:
        completer.submit(ctx)

    def committed_then_lost(rows: Sequence[Completion]) -> Claim:
        rig.store.job_claim_next(rows, ["default"], OWNER, 1, 30.0, expired=False)
        raise DatabaseError("claim failed: OperationalError: the connection is lost")

    with pytest.raises(DatabaseError):
        completer.riding(committed_then_lost)
    with rig.running(completer.run):
        assert completer.flushed.wait(timeout=10).completed == {c.job_id for c in held}
        completer.stop()
    assert sorted(o for _, o in rig.ended) == [Outcome.SUCCEEDED] * 4


def test_a_claim_whose_answer_was_lost_is_reconciled_before_the_next(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A claim that committed with its answer lost leased jobs to the worker that it
    never heard of: the next claim first gives them back, attempt uncounted."""
    known = rig.claim(app, 2)
    app.enqueue_many([("noop", {}) for _ in range(3)])
    claimer = claimer_of(rig, schema)

    lost: list[int] = []
    real = rig.store.job_claim_next

    def lost_answer(*args: Any, **kwargs: Any) -> Claim:
        lost.extend(j.id for j in real(*args, **kwargs).jobs)
        raise DatabaseError("claim failed: AdminShutdown", sqlstate="57P01")

    rig.store.job_claim_next = lost_answer  # type: ignore[method-assign]
    with pytest.raises(DatabaseError):
        claimer.claim(3, expired=False)
    assert len(lost) == 3 and all(state(db, schema, i) == JobState.RUNNING for i in lost)
    rig.store.job_claim_next = real  # type: ignore[method-assign]
    made = claimer.claim(3, expired=False)
    # Given back before the claim (attempt uncounted), then claimed again by it.
    assert sorted(j.id for j in made.jobs) == sorted(lost)
    assert all(j.attempt == 1 for j in made.jobs)
    assert all(state(db, schema, c.job_id) == JobState.RUNNING for c in known)
    rows = db.execute(
        f"SELECT count(*) FROM {schema}.jobs WHERE lease_owner = %s", (OWNER,)
    ).fetchone()
    assert rows == (5,)


def test_an_outcome_given_up_on_a_lost_connection_is_given_back_by_the_next_claim(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A release that failed on its last try forgets jobs the database still leases to
    the worker: the next claim gives them back, not their lease's end."""
    (ctx,) = rig.claim(app, 1)
    claimer = claimer_of(rig, schema)
    real = rig.store.job_release_many

    def failing(*args: Any, **kwargs: Any) -> set[int]:
        raise DatabaseError("release failed: OperationalError: the connection is lost")

    rig.store.job_release_many = failing  # type: ignore[method-assign]
    recorder = Recorder(rig.store, OWNER, rig.holdings, rig.events)
    assert not recorder.release([ctx], "stopping", last_try=True)
    rig.store.job_release_many = real  # type: ignore[method-assign]
    assert state(db, schema, ctx.job_id) == JobState.RUNNING and len(rig.holdings) == 0
    made = claimer.claim(1, expired=False)
    assert [j.id for j in made.jobs] == [ctx.job_id] and made.jobs[0].attempt == 1


def test_a_failed_renewal_is_tried_again_within_a_second(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    """A renewal whose connection dropped is tried again at once the database is back,
    not a third of a lease later: the lease runs meanwhile."""
    rig.claim(app, 1)
    calls: list[float] = []
    real = rig.store.lease_renew_many

    def flaky(*args: Any, **kwargs: Any) -> set[int]:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise DatabaseError("lease renewal failed: OperationalError: the connection is lost")
        return real(*args, **kwargs)

    rig.store.lease_renew_many = flaky  # type: ignore[method-assign]
    renewer = LeaseRenewer(
        rig.store, OWNER, rig.holdings, rig.events, None, rig.closing, RenewerConfig(lease=9.0)
    )
    renewer.renewed.enable()
    with rig.running(renewer.run):
        assert renewer.renewed.wait(timeout=10).kept == 1
    assert calls[1] - calls[0] < 1.0, f"tried again after {calls[1] - calls[0]:.1f} s"


def test_a_refused_progress_report_costs_no_other_job_its_report(
    rig: Rig, app: forklift.App, db: psycopg.Connection[Any], schema: str
) -> None:
    held = rig.claim(app, 3)
    for i, ctx in enumerate(held):
        ctx.progress(i, 3, f"step {i}")
    held[1].progress_now = (1, 3, "bad\x00")  # past ctx.progress's escaping
    writer = ProgressWriter(rig.store, OWNER, rig.holdings, rig.closing)
    assert writer.run_once() == 3
    rows = db.execute(
        f"SELECT id, progress->>'message' FROM {schema}.jobs WHERE id = ANY(%s)",
        ([c.job_id for c in held],),
    ).fetchall()
    assert dict(rows) == {held[0].job_id: "step 0", held[1].job_id: None, held[2].job_id: "step 2"}


def test_an_effect_commit_lost_with_its_connection_costs_no_attempt(
    run_worker: RunWorker, app: forklift.App, db: psycopg.Connection[Any], schema: str, dsn: str
) -> None:
    """The handler returned; its effect's commit waits on the job's row, and its
    connection is ended from outside (an operator, a pooler, a failover). The effect
    rolled back, so the job runs again: before, that attempt was charged as the job's
    failure ("completion failed: AdminShutdown"), though the job did nothing wrong."""
    job_id = app.enqueue("effect", {"key": "k", "sleep": 1.0})
    run_worker(concurrency=1)
    wait_for(lambda: state(db, schema, job_id) == "running", what="running")
    blocked = (
        "SELECT pid FROM pg_stat_activity WHERE application_name LIKE 'forklift-worker:%%'"
        " AND wait_event_type = 'Lock' AND query ILIKE '%%succeeded%%'"
        f" AND query LIKE '%%{schema}%%'"  # this test's worker, not another's at once
    )
    with psycopg.connect(dsn) as locker:
        locker.execute(f"SELECT 1 FROM {schema}.jobs WHERE id = %s FOR UPDATE", (job_id,))
        pids = wait_for(lambda: db.execute(blocked).fetchall(), what="the commit blocked")
        db.execute("SELECT pg_terminate_backend(%s)", (pids[0][0],))
        locker.rollback()
    wait_for(lambda: state(db, schema, job_id) == "succeeded", timeout=20, what="succeeded")
    row = db.execute(
        f"SELECT attempts, errors FROM {schema}.jobs WHERE id = %s", (job_id,)
    ).fetchone()
    assert row == (1, []), row
    effects = db.execute(f"SELECT count(*) FROM {schema}.effects").fetchone()
    assert effects == (1,)


def test_a_group_commit_in_flight_stays_unanswered_while_another_is_sent(
    rig: Rig, app: forklift.App
) -> None:
    """The tally shared with the parent holds one group commit's intent: while one is in
    flight (a claim carrying completions), a flush of others waits for it to be counted,
    so a kill at that moment leaves the parent the first commit's jobs to look up, not
    none (its successes then went uncounted for good)."""
    shared = SharedTally()
    events = JobEvents(OWNER, rig.holdings, rig.wakeup, Tally(shared=shared), None)
    completer = Completer(rig.store, OWNER, rig.holdings, events, rig.closing, CONFIG)
    held = rig.claim(app, 4)
    first, second = held[:2], held[2:]
    in_flight, answer = threading.Event(), threading.Event()

    def slow(rows: Sequence[Completion]) -> set[int]:
        in_flight.set()
        answer.wait(timeout=30)
        return rig.store.job_complete_many(rows, OWNER)

    riding = threading.Thread(target=completer._written, args=(first, slow), daemon=True)
    riding.start()
    assert in_flight.wait(timeout=10)
    flushing = threading.Thread(target=completer.flush, args=(second,), daemon=True)
    flushing.start()
    flushing.join(timeout=1)  # a flush that does not wait for the first is done by now
    try:
        assert {job_id for job_id, _, _ in shared.unanswered()} == {c.job_id for c in first}
    finally:
        answer.set()
        riding.join(timeout=10)
        flushing.join(timeout=10)
    assert not riding.is_alive() and not flushing.is_alive()
    shared.close()
