"""The dashboard's workflow pages in a real Chromium: /workflows lists them, /workflows/ID
draws the graph as server-rendered SVG (a box per step in a column per level, coloured
by state; a line per edge, dashed where the step ignores its upstream's failure), keeps
it current without a reload, draws the first 200 steps of a bigger one and says so, and
shows hostile workflow and step names as inert text. Cancelling a workflow is an action:
absent from a read-only dashboard, behind the login and the CSRF token otherwise,
recorded as by its operator and logged."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest

import forklift
from forklift.dashboard.graph import COLOURS
from forklift.testing import wait_for
from tests.dashboard.conftest import Dashboard, Watched, live_refreshed
from tests.dashboard.seed import ANSI, BIDI, IMG, SCRIPT, SECRET
from tests.dashboard.test_actions import WHO, login

HOSTILE_NAME = f"{SCRIPT}{IMG}{ANSI}{BIDI}"


@dataclass(frozen=True)
class Made:
    workflow: int
    ids: dict[str, int]  # job ids by the step's name as the builder gave it


@pytest.fixture
def app(dsn: str, dash_schema: str) -> Iterator[forklift.App]:
    made = forklift.App(dsn, schema=dash_schema)
    yield made
    made.close()


def make(app: forklift.App, db: psycopg.Connection[Any], schema: str) -> Made:
    """extract → train, validate; report after both (ignoring their failure); publish
    after report; audit after validate. extract succeeded, train runs, validate went dead
    (so audit was cancelled). The workflow's name and train's are hostile, and the
    context has a secret: written in SQL, as a producer bypassing the builder might."""
    wf = app.workflow(name="nightly", context={"api_key": SECRET, "day": "2026-12-07"})
    extract = wf.add("extract", {}, name="extract")
    train = wf.add("train", {}, after=[extract], name="train")
    validate = wf.add("validate", {}, after=[extract], name="validate")
    report = wf.add("report", {}, after=[train, validate], ignore_failure=True, name="report")
    wf.add("publish", {}, after=[report], name="publish")
    wf.add("audit", {}, after=[validate], name="audit")
    workflow = wf.enqueue()
    ids = {s.name: s.id for s in wf.steps if s.id is not None}
    db.execute(f"UPDATE {schema}.workflows SET name = %s WHERE id = %s", (HOSTILE_NAME, workflow))
    running = (
        "state = 'running', attempts = 1, started_at = now(), lease_owner = 'h:1:w',"
        " lease_until = now() + interval '1 hour'"
    )
    dead = "state = 'dead', attempts = 3, completed_at = now(), last_error = %(error)s"
    for name, sets in (
        ("train", "step = %(name)s"),
        ("extract", "state = 'succeeded', attempts = 1, completed_at = now()"),
        ("train", running),
        ("validate", dead),
    ):
        params = {"id": ids[name], "name": HOSTILE_NAME, "error": IMG}
        db.execute(f"UPDATE {schema}.jobs SET {sets} WHERE id = %(id)s", params)
    return Made(workflow, ids)


def rgb(colour: str) -> str:
    """`#1a7f37` as getComputedStyle gives it: `rgb(26, 127, 55)`."""
    r, g, b = (int(colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def boxes(page: Any) -> dict[int, dict[str, Any]]:
    """Each step's box in the graph by job id: its state, level, place and fill."""
    found: list[dict[str, Any]] = page.eval_on_selector_all(
        "svg.graph g.step",
        """gs => gs.map(g => { const r = g.querySelector('rect'); return {
            job: Number(g.dataset.job), state: g.dataset.state, level: Number(g.dataset.level),
            x: Number(r.getAttribute('x')), y: Number(r.getAttribute('y')),
            fill: getComputedStyle(r).fill, stroke: getComputedStyle(r).stroke,
            text: [...g.querySelectorAll('text')].map(t => t.textContent).join(' | ')}; })""",
    )
    return {b["job"]: b for b in found}


def test_a_workflow_is_listed_and_drawn_a_box_per_step_coloured_by_state(
    dashboard: Dashboard, app: forklift.App, db: psycopg.Connection[Any], dash_schema: str,
    watched: Any,
) -> None:  # fmt: skip
    made = make(app, db, dash_schema)
    ids = made.ids
    w: Watched = watched()
    page = w.page
    answer = page.goto(dashboard("/workflows"))
    assert answer is not None and answer.status == 200
    row = page.locator(
        "table.workflows tr", has=page.locator(f"a[href='/workflows/{made.workflow}']")
    )
    cells = row.locator("td").all_inner_texts()
    assert cells[2:10] == ["running", "6", "2", "0", "1", "1", "1", "1"]
    assert SCRIPT in cells[1]  # as text
    page.click(f"a[href='/workflows/{made.workflow}']")
    page.wait_for_url(dashboard(f"/workflows/{made.workflow}"))
    live_refreshed(page)  # the live part drew it again: what follows holds for both

    drawn = boxes(page)
    assert sorted(drawn) == sorted(ids.values())
    states = {"extract": "succeeded", "train": "running", "validate": "dead",
              "report": "blocked", "publish": "blocked", "audit": "cancelled"}  # fmt: skip
    levels = {"extract": 0, "train": 1, "validate": 1, "report": 2, "audit": 2, "publish": 3}
    for name, job in ids.items():
        box = drawn[job]
        assert (box["state"], box["level"]) == (states[name], levels[name]), name
        assert (box["fill"], box["stroke"]) == tuple(rgb(c) for c in COLOURS[states[name]])
        assert f"{states[name]} · job {job}" in box["text"]
    # Columns by level, rows by id within one: x grows with the level, y with the row.
    xs = {levels[n]: drawn[j]["x"] for n, j in ids.items()}
    assert xs[0] < xs[1] < xs[2] < xs[3]
    assert drawn[ids["train"]]["x"] == drawn[ids["validate"]]["x"]
    assert drawn[ids["train"]]["y"] < drawn[ids["validate"]]["y"]
    edges = page.locator("svg.graph path.edge")
    assert edges.count() == 6
    assert page.locator("svg.graph path.edge[stroke-dasharray]").count() == 2  # into report
    assert page.locator(f"svg.graph a[href='/jobs/{ids['audit']}']").count() == 1

    steps = page.inner_text("table.steps")
    assert f"Cancelled: upstream job {ids['validate']} (validate) dead" in steps
    assert "(ignores failure)" in steps and "waits for" in steps
    check_inert(page)
    w.quiet()


def check_inert(page: Any) -> None:
    """The hostile names are on the page as text, and did nothing."""
    text = page.inner_text("main")
    assert SCRIPT in text and "\\x1b[2J" in text and "evil\\u202etxt.exe" in text
    assert "\x1b" not in text and "\u202e" not in text
    assert page.locator("img").count() == 0 and page.locator("[onerror]").count() == 0
    assert page.locator("script").count() == 1  # /static/dashboard.js alone
    assert SECRET not in page.content() and '"api_key": "***"' in text
    titles = page.eval_on_selector_all("svg.graph title", "ts => ts.map(t => t.textContent)")
    assert any(t.startswith(SCRIPT) for t in titles)  # the whole name in the tooltip


def test_the_graph_follows_the_workflow_without_a_reload(
    dashboard: Dashboard, app: forklift.App, db: psycopg.Connection[Any], dash_schema: str,
    watched: Any,
) -> None:  # fmt: skip
    """train succeeds: its box turns green, and report, which waited only for it, is
    released (ready) by the trigger, and its box says so, within the live refresh."""
    made = make(app, db, dash_schema)
    w: Watched = watched()
    page = w.page
    page.goto(dashboard(f"/workflows/{made.workflow}"))
    assert boxes(page)[made.ids["report"]]["state"] == "blocked"
    db.execute(
        f"UPDATE {dash_schema}.jobs SET state = 'succeeded', completed_at = now(),"
        " lease_owner = NULL, lease_until = NULL WHERE id = %s",
        (made.ids["train"],),
    )
    page.wait_for_function(
        "id => document.querySelector(`svg.graph g.step[data-job='${id}']`)"
        ".dataset.state === 'ready'",
        arg=made.ids["report"],
        timeout=5000,
    )
    drawn = boxes(page)
    assert drawn[made.ids["train"]]["fill"] == rgb(COLOURS["succeeded"][0])
    assert drawn[made.ids["report"]]["fill"] == rgb(COLOURS["ready"][0])
    w.quiet()


def test_a_workflow_of_more_than_200_steps_draws_200_and_counts_the_rest(
    dashboard: Dashboard, app: forklift.App, dash_schema: str, watched: Any
) -> None:
    wf = app.workflow(name="wide")
    root = wf.add("extract", {}, name="root")
    for i in range(229):
        wf.add("train", {}, after=[root], name=f"leaf{i}")
    workflow = wf.enqueue()
    w: Watched = watched()
    page = w.page
    page.goto(dashboard(f"/workflows/{workflow}"))
    live_refreshed(page)
    assert page.locator("svg.graph g.step").count() == 200
    assert page.locator("svg.graph path.edge").count() == 199
    assert page.locator("table.steps tbody tr").count() == 200
    assert page.inner_text("p.more") == (
        "… and 30 more steps not shown (the first 200 by job id are); all 230 by state: "
        "229 blocked, 1 ready, 0 running, 0 succeeded, 0 dead, 0 cancelled"
    )
    missing = page.request.get(dashboard("/workflows/424242"))
    assert missing.status == 404
    assert f"no workflow 424242 in schema {dash_schema}" in missing.text()
    w.quiet()


def test_cancel_workflow_is_an_action_behind_the_login_recorded_and_logged(
    dashboard: Dashboard, acting: Dashboard, app: forklift.App, db: psycopg.Connection[Any],
    dash_schema: str, watched: Any,
) -> None:  # fmt: skip
    made = make(app, db, dash_schema)
    reader: Watched = watched()
    page = reader.page
    page.goto(dashboard(f"/workflows/{made.workflow}"))
    assert page.locator("form[method=post]").count() == 0
    answer = page.request.post(
        dashboard("/actions/cancel-workflow"), form={"workflow": str(made.workflow)}
    )
    assert answer.status == 404  # a read-only dashboard has no action endpoints

    w: Watched = watched()
    page = login(w, acting)
    page.wait_for_url(acting("/"))
    page.goto(acting(f"/workflows/{made.workflow}"))
    csrf = page.locator("form input[name=csrf]").first.get_attribute("value")
    refused = page.request.post(
        acting("/actions/cancel-workflow"), form={"workflow": str(made.workflow)},
        max_redirects=0,
    )  # fmt: skip
    assert refused.status == 403 and csrf  # no CSRF token
    page.click("button.cancel")
    page.wait_for_url(acting(f"/workflows/{made.workflow}"))
    flash = page.inner_text(".flash")
    assert flash == (
        f"workflow {made.workflow}: cancelled by {WHO}; 2 blocked, 0 ready and 1 running "
        "steps cancelled (its worker is told to stop); it is cancelled now"
    )
    states = dict(
        db.execute(
            f"SELECT id, state::text FROM {dash_schema}.jobs WHERE workflow_id = %s",
            (made.workflow,),
        ).fetchall()
    )
    assert sorted(states.values()) == ["cancelled"] * 4 + ["dead", "succeeded"]
    row = db.execute(
        f"SELECT cancelled_by, outcome FROM {dash_schema}.workflows WHERE id = %s",
        (made.workflow,),
    ).fetchone()
    assert row == (WHO, "cancelled")
    assert page.locator("button.cancel").count() == 0  # finished: nothing left to cancel
    wait_for(
        lambda: re.search(
            rf"dashboard\.action who={re.escape(WHO)} action=cancel_workflow "
            rf"workflow={made.workflow} ",
            acting.proc.output(),
        ),
        what="the cancel logged",
    )
    reader.quiet()
    w.quiet()
