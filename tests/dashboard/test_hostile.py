"""What hostile producers, handlers and hosts write reaches every page as inert text:
`<script>`, `"><img src=x onerror=...>`, ANSI escapes and bidi overrides in task and
queue names, keys, arguments, errors, tracebacks, hosts, schedules and batch callbacks
render as the characters they are (control and bidi characters escaped, as the CLI shows
them); no dialog ever opens, no element is injected, and no secret appears."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from tests.dashboard.conftest import Dashboard, Watched, live_refreshed
from tests.dashboard.seed import IMG, SCRIPT, SECRET, hostile, seed


@pytest.fixture(scope="module")
def rows(dsn: str, dash_schema: str) -> tuple[int, int]:
    seed(dsn, dash_schema)
    return hostile(dsn, dash_schema)


def test_hostile_values_render_as_inert_text_on_every_page(
    dashboard: Dashboard, rows: tuple[int, int], watched: Any
) -> None:
    job, batch = rows
    w: Watched = watched()
    paths = [
        "/", "/jobs", f"/jobs/{job}", f"/jobs?queue={quote(IMG)}&task={quote(SCRIPT)}",
        "/batches", f"/batches/{batch}", "/schedules", "/processes", "/jobs?state=dead",
    ]  # fmt: skip
    tabs = {path: w.tab() for path in paths}
    for path, tab in tabs.items():
        tab.goto(dashboard(path))
    for path, tab in tabs.items():
        live_refreshed(tab)  # the live parts too: what the refresh put in is inert as well
        text = tab.inner_text("body")
        assert tab.locator("img").count() == 0, path
        assert tab.locator("script").count() == 1, path  # /static/dashboard.js alone
        assert tab.locator("[onerror]").count() == 0, path
        assert "\x1b" not in text and "\u202e" not in text and "\x07" not in text, path
        assert SECRET not in tab.content(), path
        if path != "/jobs?state=dead":
            assert SCRIPT in text or IMG in text, f"{path} shows no hostile value as text"
    job_text = tabs[f"/jobs/{job}"].inner_text("body")
    for shown in (SCRIPT, IMG, "\\x1b[2J\\x1b[31mFAKE", "evil\\u202etxt.exe", "\\x07"):
        assert shown in job_text, f"the job page does not show {shown!r} as text"
    traceback = tabs[f"/jobs/{job}"].locator("pre.traceback").inner_text()
    assert traceback.splitlines()[1] == f"  {IMG}"  # its lines stay lines, escaped
    fields = tabs[f"/jobs/{job}"].locator("table.fields")
    assert fields.locator("tr", has_text="steps done").locator("td").inner_text() == SCRIPT
    state = fields.locator("tr", has_text="checkpoint state").locator("td").inner_text()
    assert state == f'{{"token": "***", "{SCRIPT}": "evil\\u202etxt.exe"}}'  # as jsonb orders
    w.quiet()
