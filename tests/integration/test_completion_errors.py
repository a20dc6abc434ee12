"""A group completion with one bad row among good ones (issue 34, item 2), against a
real PostgreSQL: only the bad row fails, saying why; the rest succeed; a data error is
never retried as if the database were away."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
import pytest

import forklift
from forklift.store import Claim, Completion, JobState
from forklift.testing import wait_for
from forklift.workers.completer import Completer, CompleterConfig
from forklift.workers.context import JobContext
from forklift.workers.events import Outcome
from tests.integration.conftest import RunWorker
from tests.integration.test_worker_services import OWNER, Rig, open_rig, state

# Before the fix a refused batch was retried until this gave up: long enough that a
# retried data error shows in the statement count, short enough for the test.
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
    """The issue's reproduction: ctx.progress(1, 2, "bad\\x00") and a lone surrogate
    among ordinary jobs, group-committed together: 46 of 79 innocent jobs ended dead."""
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
