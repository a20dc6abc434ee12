"""Every page of a read-only dashboard in a real Chromium: it renders, refreshes its live
parts with no console error, hides secrets; the jobs list filters and pages; a job that
dies while the overview is open shows up within 2 s, without a click."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit
from urllib.request import urlopen

import psycopg
import pytest

import forklift
from forklift.testing import ForkliftProcess, wait_for
from tests.dashboard.conftest import Dashboard, Watched, live_refreshed
from tests.dashboard.seed import SECRET, Seeded, seed

PAGE = 50


@pytest.fixture(scope="module")
def seeded(dsn: str, dash_schema: str) -> Seeded:
    return seed(dsn, dash_schema)


def test_every_page_renders_and_refreshes_with_no_console_error(
    dashboard: Dashboard, seeded: Seeded, watched: Any
) -> None:
    w: Watched = watched()
    expected = {
        "/": ["Queues", "images", "web-1", "web-2", "resize#", "Latest dead jobs",
              "OSError: truncated image", "done per minute", "dead per minute",
              "2 no worker"],
        "/jobs": ["Jobs", "resize", "succeeded", "OSError: truncated image"],
        "/jobs?state=scheduled": ["build_report", "reports"],
        "/jobs?queue=emails": ["send_receipt", "dead", "5/5"],
        f"/jobs/{seeded.dead[-1]}": ["attempts", "5 of 5", "Traceback (most recent call last)",
                                    "smtp_password", "***", "buyer", "(2m ago), version 3",
                                    '{"recipients": 41}', "attach, render",
                                    '{"sent": 41, "smtp_password": "***"}'],
        f"/jobs/{seeded.running[1]}": ["running", "60/100 (60%): resizing", "web-1:4102"],
        "/batches": ["Open", f"{seeded.batch}", "assemble"],
        f"/batches/{seeded.batch}": ["27 of 40 done", "25 succeeded", "2 dead", "eta",
                                    "assemble in queue default", "MemoryError"],
        "/schedules": ["nightly-reindex", "0 3 * * *", "Europe/Zagreb", "TimeoutError"],
        "/processes": ["web-1", "web-2", "supervisor", "80 MiB", "emails, reports [gpu]"],
    }  # fmt: skip
    # Each page in a tab of its own, all open at once: their live parts refresh together.
    tabs = {path: w.tab() for path in expected}
    for path, tab in tabs.items():
        answer = tab.goto(dashboard(path))
        assert answer is not None and answer.status == 200, path
        assert answer.headers["content-security-policy"].startswith("default-src 'none'")
    for path, tab in tabs.items():
        live_refreshed(tab)
        text = tab.inner_text("body")
        missing = [t for t in expected[path] if t not in text]
        assert missing == [], f"{path} does not show {missing}"
        assert SECRET not in tab.content(), f"{path} shows a secret"
    w.quiet()


def _ids(page: Any) -> list[int]:
    return [int(t) for t in page.locator("table.jobs tbody tr td:first-child").all_inner_texts()]


def test_the_jobs_list_filters_and_pages_by_keyset(
    dashboard: Dashboard,
    seeded: Seeded,
    watched: Any,
    db: psycopg.Connection[Any],
    dash_schema: str,
) -> None:
    w: Watched = watched()
    page = w.page
    page.goto(dashboard("/jobs"))
    page.select_option("select[name=state]", "ready")
    page.fill("input[name=queue]", "images")
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**/jobs?*")
    assert parse_qs(urlsplit(page.url).query) == {"state": ["ready"], "queue": ["images"]}
    seen: list[int] = []
    for _ in range(4):
        ids = _ids(page)
        states = set(page.locator("table.jobs tbody .state").all_inner_texts())
        assert states == {"ready"}, (page.url, page.inner_text("main")[-600:])
        assert ids == sorted(ids, reverse=True)
        assert not set(ids) & set(seen) and (not seen or max(ids) < min(seen))
        seen += ids
        older = page.locator("a[rel=next]")
        if older.count() == 0:
            break
        assert len(ids) == PAGE
        older.click()
        page.wait_for_url("**before=*")
    rows = db.execute(
        f"SELECT id FROM {dash_schema}.jobs WHERE queue = 'images' AND state = 'ready'"
        " AND batch_id IS NULL ORDER BY id DESC"
    ).fetchall()
    assert seen == [r[0] for r in rows] and len(seen) == seeded.images - len(seeded.running)
    page.click("a[rel=first]")
    page.wait_for_url(lambda url: "before" not in url)
    assert _ids(page) == seen[:PAGE]

    page.goto(dashboard("/jobs"))
    page.fill("input[name=error]", "smtpserverdisconnected")  # any case, as jobs list
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**error=*")
    assert sorted(_ids(page)) == seeded.dead
    w.quiet()


def test_a_job_that_dies_while_the_overview_is_open_appears_within_2s(
    dashboard: Dashboard, dash_env: dict[str, str], dsn: str, dash_schema: str,
    db: psycopg.Connection[Any], watched: Any, tmp_path: Path,
) -> None:  # fmt: skip
    w: Watched = watched()
    page = w.page
    page.goto(dashboard("/"))
    began = time.monotonic()
    sup = ForkliftProcess(
        ["run", "tests.apps.dashboard:app", "--workers", "1", "--queues", "doomed"],
        dash_env,
        tmp_path / "run.log",
    )
    try:
        job_id = forklift.App(dsn, schema=dash_schema).enqueue(
            "doomed", {"why": "the page is open"}, queue="doomed", max_attempts=1
        )
        wait_for(
            lambda: (
                db.execute(
                    f"SELECT state = 'dead' FROM {dash_schema}.jobs WHERE id = %s", (job_id,)
                ).fetchone()
                == (True,)
            ),
            timeout=20,
            interval=0.01,
            what="the job dead",
        )
        died = time.monotonic()
        row = page.locator(f"#dead-{job_id}")
        row.wait_for(timeout=2_000)  # the deadline: within 2 s of its death
        shown = time.monotonic() - died
        assert "doomed on purpose: the page is open" in row.inner_text()
        print(f"dead job shown {shown:.2f} s after it died; {time.monotonic() - began:.1f} s in")
    finally:
        t = time.monotonic()
        sup.stop(timeout=30)
        print(f"stopped in {time.monotonic() - t:.1f} s")
    w.quiet()


def test_the_jobs_header_names_the_database_not_the_filter(
    dashboard: Dashboard, seeded: Seeded, dash_schema: str
) -> None:
    for path in ("/", "/jobs", "/jobs?state=dead&queue=emails"):
        with urlopen(dashboard(path), timeout=20) as answer:
            page = answer.read().decode()
        header = re.search(r'<span class="where">(.*?)</span>', page, re.S)
        assert header is not None, path
        assert f"schema {dash_schema}" in header[1] and "JobFilter" not in header[1], (
            path,
            header[1],
        )
