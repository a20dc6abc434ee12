"""The dashboard in a real browser: Debian's headless Chromium (installed by scripts/setup;
required in CI) driven by Playwright, one browser for the whole run, a fresh context per
test; `forklift dashboard` as a real process on a port of its own, per module."""

from __future__ import annotations

import os
import re
import secrets
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import ForkliftProcess, wait_for
from tests.tools import tool

playwright = pytest.importorskip("playwright.sync_api")

TOKEN = "dashboard-test-token-0123456789"
FLAGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
_URL = re.compile(r"forklift dashboard: (http://\S+/) ")


@pytest.fixture(scope="package")
def browser() -> Iterator[Any]:
    """One headless Chromium for every dashboard test (Playwright starts it with a fresh
    profile of its own in a temporary --user-data-dir). Package-scoped: Playwright's sync
    API keeps an event loop running on the main thread while it is open, so it must be
    gone before tests elsewhere call asyncio.run."""
    chromium = tool("chromium", install="apt-get install chromium; scripts/setup does")
    with playwright.sync_playwright() as p:
        found = p.chromium.launch(executable_path=chromium, args=FLAGS, headless=True)
        yield found
        found.close()


@dataclass
class Watched:
    """A browser context's pages, and what they said: console errors, uncaught
    exceptions, dialogs opened (each dismissed at once)."""

    context: Any
    errors: list[str] = field(default_factory=list)
    dialogs: list[str] = field(default_factory=list)
    pages: list[Any] = field(default_factory=list)

    @property
    def page(self) -> Any:
        """The first page (a tab): made on first use."""
        return self.pages[0] if self.pages else self.tab()

    def tab(self) -> Any:
        """Another page in this context, watched."""
        page = self.context.new_page()
        page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        page.on("dialog", self._dialog)
        page.set_default_timeout(10_000)
        self.pages.append(page)
        return page

    def _dialog(self, dialog: Any) -> None:
        self.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    def quiet(self) -> None:
        assert self.dialogs == [], f"dialogs opened: {self.dialogs}"
        assert self.errors == [], f"console errors: {self.errors}"


@pytest.fixture
def watched(browser: Any) -> Iterator[Callable[[], Watched]]:
    """Pages in fresh contexts (no cookies) that note console errors and dialogs (each
    dialog is dismissed at once). The test asserts on them (`quiet()`)."""
    contexts = []

    def make() -> Watched:
        context = browser.new_context(viewport={"width": 1300, "height": 900})
        contexts.append(context)
        return Watched(context)

    yield make
    for context in contexts:
        context.close()


@pytest.fixture(scope="module")
def dash_schema(dsn: str) -> Iterator[str]:
    """A migrated schema for one module, dropped after it."""
    name = f"t_dash_{secrets.token_hex(4)}"
    forklift.App(dsn, schema=name).migrate()
    yield name
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


@pytest.fixture(scope="module")
def dash_env(dsn: str, dash_schema: str) -> dict[str, str]:
    e = {k: v for k, v in os.environ.items() if not k.startswith("FORKLIFT_")}
    e.update(
        FORKLIFT_DATABASE_URL=dsn,
        FORKLIFT_SCHEMA=dash_schema,
        FORKLIFT_LOG_FORMAT="text",
        FORKLIFT_METRICS_ADDR="127.0.0.1:0",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    return e


class Dashboard:
    """`forklift dashboard` on a free loopback port, its output in a file."""

    def __init__(self, env: dict[str, str], log: Path, *flags: str) -> None:
        self.proc = ForkliftProcess(["dashboard", "--bind", "127.0.0.1:0", *flags], env, log)
        try:
            found = wait_for(
                lambda: _URL.search(self.proc.output()) or self._died(),
                timeout=20,
                what="the dashboard's address",
            )
        except BaseException:
            self.proc.kill()
            raise
        self.url: str = found[1]

    def _died(self) -> bool:
        """False while it runs; the test fails once it has exited."""
        if not self.proc.alive:
            pytest.fail(f"forklift dashboard exited:\n{self.proc.output()[-3000:]}")
        return False

    def __call__(self, path: str) -> str:
        return self.url.rstrip("/") + path


@pytest.fixture(scope="module")
def dashboard(
    dash_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dashboard]:
    """A read-only dashboard over the module's schema."""
    d = Dashboard(dash_env, tmp_path_factory.mktemp("dash") / "dashboard.log")
    yield d
    assert d.proc.stop(timeout=10) == 0, "SIGTERM: a clean exit"


@pytest.fixture(scope="module")
def acting(
    dash_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Dashboard]:
    """A dashboard with --allow-actions and a token over the module's schema."""
    env = {**dash_env, "FORKLIFT_DASHBOARD_TOKEN": TOKEN}
    d = Dashboard(env, tmp_path_factory.mktemp("dash") / "acting.log", "--allow-actions")
    yield d
    assert d.proc.stop(timeout=10) == 0, "SIGTERM: a clean exit"


def live_refreshed(page: Any) -> None:
    """Wait until every live part of the page that refreshes each second has been
    refreshed at least once (the charts' every ten seconds are not waited for)."""
    page.wait_for_function(
        "() => [...document.querySelectorAll('[data-live]')]"
        ".filter(e => Number(e.dataset.every) <= 2000)"
        ".every(e => e.dataset.refreshed || e.classList.contains('stale'))"
    )
