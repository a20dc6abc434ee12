"""The dashboard's actions: none without --allow-actions; with it, retry and pause work
after a login with the token, are recorded in the job's error history (and the paused
queue) as by `dashboard:NAME@ADDRESS` and logged; refused without a login, without the
CSRF token, with a wrong one, and from another origin."""

from __future__ import annotations

import re
from typing import Any

import psycopg
import pytest

from forklift.testing import wait_for
from tests.dashboard.conftest import TOKEN, Dashboard, Watched
from tests.dashboard.seed import Seeded, seed

WHO = "dashboard:alice@127.0.0.1"


@pytest.fixture(scope="module")
def seeded(dsn: str, dash_schema: str) -> Seeded:
    return seed(dsn, dash_schema)


def _state(db: psycopg.Connection[Any], schema: str, job_id: int) -> str:
    row = db.execute(f"SELECT state::text FROM {schema}.jobs WHERE id = %s", (job_id,)).fetchone()
    assert row is not None
    return str(row[0])


def login(w: Watched, acting: Dashboard, token: str = TOKEN, name: str = "alice") -> Any:
    page = w.page
    page.goto(acting("/"))
    page.wait_for_url(lambda url: "/login?next=" in url)
    page.fill("input[name=token]", token)
    page.fill("input[name=name]", name)
    page.click("form.login button[type=submit]")
    return page


def test_a_read_only_dashboard_has_no_action_endpoints(
    dashboard: Dashboard, seeded: Seeded, watched: Any
) -> None:
    w: Watched = watched()
    page = w.page
    page.goto(dashboard(f"/jobs/{seeded.dead[0]}"))
    assert page.locator("form[method=post]").count() == 0
    for path in ("/actions/retry", "/actions/pause", "/actions/purge", "/login", "/logout"):
        answer = page.request.post(dashboard(path), form={"job": str(seeded.dead[0])})
        assert answer.status == 404, path
    w.quiet()


def test_retry_and_pause_after_a_login_recorded_and_logged(
    acting: Dashboard, seeded: Seeded, watched: Any, db: psycopg.Connection[Any], dash_schema: str
) -> None:
    w: Watched = watched()
    page = login(w, acting, token="not-the-token-at-all")
    assert "wrong token" in page.inner_text("main")
    page = login(w, acting)
    page.wait_for_url(acting("/"))
    [cookie] = w.context.cookies()
    assert (cookie["httpOnly"], cookie["sameSite"]) == (True, "Strict")

    job = seeded.dead[0]
    page.goto(acting(f"/jobs/{job}"))
    page.click("button.retry")
    page.wait_for_url(acting(f"/jobs/{job}"))
    assert "retried (was dead)" in page.inner_text(".flash")
    assert _state(db, dash_schema, job) == "ready"
    row = db.execute(f"SELECT errors FROM {dash_schema}.jobs WHERE id = %s", (job,)).fetchone()
    assert row is not None and row[0][-1]["error"].startswith(f"Retried by {WHO}: attempts 5")
    assert f"retried by {WHO} at" in page.inner_text("ol.history")

    page.goto(acting("/"))
    page.click("button[data-queue=emails]")
    page.wait_for_url(acting("/"))
    paused = db.execute(f"SELECT paused_by FROM {dash_schema}.paused_queues").fetchall()
    assert paused == [(WHO,)]
    page.click("button[data-queue=emails]")  # now it says resume
    page.wait_for_url(acting("/"))
    assert db.execute(f"SELECT count(*) FROM {dash_schema}.paused_queues").fetchone() == (0,)

    log = acting.proc.output()
    for action in ("retry", "pause", "resume"):
        assert re.search(rf"dashboard\.action who={re.escape(WHO)} action={action} ", log), action
    w.quiet()


def test_actions_are_refused_without_a_login_or_without_the_csrf_token(
    acting: Dashboard, seeded: Seeded, watched: Any, db: psycopg.Connection[Any], dash_schema: str
) -> None:
    job = seeded.dead[1]
    stranger: Watched = watched()
    answer = stranger.page.request.post(
        acting("/actions/retry"), form={"job": str(job), "csrf": "a-guess"}, max_redirects=0
    )
    assert answer.status == 403
    page = stranger.page
    page.goto(acting(f"/jobs/{job}"))
    assert "/login" in page.url  # nothing to see without the login either

    w: Watched = watched()
    page = login(w, acting)
    page.wait_for_url(acting("/"))
    page.goto(acting(f"/jobs/{job}"))
    csrf = page.locator("form input[name=csrf]").first.get_attribute("value")
    refused = [
        {"job": str(job)},  # no CSRF token
        {"job": str(job), "csrf": "x" * len(csrf or "")},  # a wrong one
    ]
    for form in refused:
        answer = page.request.post(acting("/actions/retry"), form=form, max_redirects=0)
        assert answer.status == 403, form
    answer = page.request.post(
        acting("/actions/retry"),
        form={"job": str(job), "csrf": csrf or ""},
        headers={"Origin": "http://evil.example"},
        max_redirects=0,
    )
    assert answer.status == 403
    assert page.request.get(acting("/actions/retry")).status == 405  # POST only
    assert _state(db, dash_schema, job) == "dead"
    answer = page.request.post(
        acting("/actions/retry"), form={"job": str(job), "csrf": csrf or ""}, max_redirects=0
    )
    assert answer.status == 303  # the same request with everything in order
    wait_for(lambda: _state(db, dash_schema, job) == "ready", what="the job retried")
    stranger.quiet()
    w.quiet()


def _checkpointed(db: psycopg.Connection[Any], schema: str, job_id: int) -> bool:
    row = db.execute(
        f"SELECT checkpoint IS NOT NULL OR checkpoint_at IS NOT NULL FROM {schema}.jobs"
        " WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return bool(row[0])


def test_retry_from_scratch_clears_the_checkpoint_and_so_does_a_cancel(
    acting: Dashboard, seeded: Seeded, watched: Any, db: psycopg.Connection[Any], dash_schema: str
) -> None:
    """A job with a checkpoint offers a retry from scratch beside the retry (that one
    resumes it); a cancel clears the checkpoint too, and a job without one is offered
    the plain retry alone."""
    w: Watched = watched()
    page = login(w, acting)
    page.wait_for_url(acting("/"))
    job = seeded.dead[-1]  # seeded with a checkpoint
    assert _checkpointed(db, dash_schema, job)
    page.goto(acting(f"/jobs/{job}"))
    assert "version 3" in page.inner_text("table.fields")
    page.click("button.retry-scratch")
    page.wait_for_url(acting(f"/jobs/{job}"))
    assert "checkpoint cleared: starts from scratch" in page.inner_text(".flash")
    assert _state(db, dash_schema, job) == "ready" and not _checkpointed(db, dash_schema, job)
    assert "version 3" not in page.inner_text("table.fields")

    db.execute(
        f"UPDATE {dash_schema}.jobs SET checkpoint = '{{\"v\": 4}}', checkpoint_at = now()"
        " WHERE id = %s",
        (job,),
    )
    page.goto(acting(f"/jobs/{job}"))
    assert "version 4" in page.inner_text("table.fields")
    page.click("button.cancel")
    page.wait_for_url(acting(f"/jobs/{job}"))
    assert "cancelled (was ready)" in page.inner_text(".flash")
    assert _state(db, dash_schema, job) == "cancelled" and not _checkpointed(db, dash_schema, job)
    assert page.locator("button.retry").count() == 1
    assert page.locator("button.retry-scratch").count() == 0  # nothing to start over from
    log = acting.proc.output()
    assert re.search(rf"action=retry job={job} from_scratch=True ", log), log[-2000:]
    w.quiet()
