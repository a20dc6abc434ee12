"""`forklift dashboard` without a database: its flags and refusals, the missing extra,
the lazy import, and what every answer carries (headers, cookie, CSRF, Host checks)."""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import pytest

from forklift import _db
from forklift.admin import Connector
from forklift.cli import main
from forklift.dashboard import security
from forklift.dashboard.config import DashboardConfig, is_loopback, parse_bind
from forklift.errors import ConfigError, install_hint

TOKEN = "sixteen-chars-or-more"
DSN = "postgresql://nobody@127.0.0.1:9/none"


@pytest.mark.parametrize(
    ("text", "parsed"),
    [("127.0.0.1:8787", ("127.0.0.1", 8787)), ("[::1]:0", ("::1", 0)),
     ("0.0.0.0:80", ("0.0.0.0", 80)), ("localhost:65535", ("localhost", 65535))],
)  # fmt: skip
def test_bind_parses_host_and_port(text: str, parsed: tuple[str, int]) -> None:
    assert parse_bind(text) == parsed


@pytest.mark.parametrize("text", ["8787", "127.0.0.1", ":8787", "h:70000", "h:-1", "h:x"])
def test_a_bad_bind_says_how_to_write_it(text: str) -> None:
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        parse_bind(text)


def test_loopback_is_known_by_address_and_by_name() -> None:
    assert all(map(is_loopback, ["127.0.0.1", "127.3.4.5", "::1", "localhost"]))
    assert not any(map(is_loopback, ["0.0.0.0", "::", "10.1.2.3", "no-such-host.invalid"]))


def test_actions_need_a_token_and_loopback_and_a_wide_bind_without_a_token_warns() -> None:
    with pytest.raises(ConfigError, match="FORKLIFT_DASHBOARD_TOKEN"):
        DashboardConfig("127.0.0.1", 0, allow_actions=True).checked()
    with pytest.raises(ConfigError, match="FORKLIFT_DASHBOARD_TOKEN"):
        DashboardConfig("0.0.0.0", 0, allow_actions=True).checked()
    with pytest.raises(ConfigError, match="at least 16"):
        DashboardConfig("127.0.0.1", 0, token="short").checked()
    [warning] = DashboardConfig("0.0.0.0", 8787).checked()
    assert "without FORKLIFT_DASHBOARD_TOKEN" in warning
    assert DashboardConfig("127.0.0.1", 8787).checked() == []
    assert DashboardConfig("127.0.0.1", 8787, allow_actions=True, token=TOKEN).checked() == []
    with pytest.raises(ConfigError, match=r"only on a loopback address, not 0\.0\.0\.0"):
        DashboardConfig("0.0.0.0", 8787, allow_actions=True, token=TOKEN).checked()


def test_the_cli_refuses_actions_without_a_token_with_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("FORKLIFT_DASHBOARD_TOKEN", raising=False)
    assert main(["dashboard", "--allow-actions", "--dsn", DSN]) == 2
    assert "--allow-actions needs a login token" in capsys.readouterr().err


def test_without_the_extra_the_cli_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name in [m for m in sys.modules if m.startswith(("flask", "forklift.dashboard.s"))]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flask", None)  # import flask: ModuleNotFoundError
    assert main(["dashboard", "--dsn", DSN]) == 2
    err = capsys.readouterr().err
    assert "flask is not installed" in err and install_hint("dashboard") in err


def test_importing_the_cli_imports_no_part_of_the_dashboard() -> None:
    code = (
        "import sys, forklift.cli; print(sorted(m for m in sys.modules if m.split('.')[0] in"
        " ('flask', 'jinja2', 'werkzeug') or m.startswith('forklift.dashboard')))"
    )
    found = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert found.stdout.strip() == "[]"


@pytest.fixture
def client() -> Any:
    from forklift.dashboard.reader import Reader
    from forklift.dashboard.web import create_app

    reader = Reader(DSN, "forklift", Connector(DSN, _db.Timeouts(connect=0.5)))
    app = create_app(DashboardConfig("127.0.0.1", 0, True, TOKEN), reader)
    return app.test_client()


def test_every_answer_carries_the_security_headers_and_a_strict_session_cookie(
    client: Any,
) -> None:
    answer = client.get("/login")
    assert answer.status_code == 200
    for name, value in security.HEADERS.items():
        assert answer.headers[name] == value
    assert "unsafe-inline" not in answer.headers["Content-Security-Policy"]
    assert answer.headers["Cache-Control"] == "no-store"
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert client.get("/").status_code == 303  # every page asks for the login first
    assert client.get("/healthz").status_code == 200  # but the probe's


def test_a_post_without_the_csrf_token_a_foreign_origin_or_host_is_refused(client: Any) -> None:
    client.get("/login")  # a session, with its CSRF token
    with client.session_transaction() as session:
        csrf = session["csrf"]
    form = {"token": TOKEN, "name": "alice"}
    assert client.post("/login", data=form).status_code == 403
    assert client.post("/login", data={**form, "csrf": "x"}).status_code == 403
    foreign = {"Origin": "http://evil.example"}
    assert client.post("/login", data={**form, "csrf": csrf}, headers=foreign).status_code == 403
    assert client.get("/login", headers={"Host": "evil.example"}).status_code == 421
    assert client.post("/login", data={**form, "csrf": csrf}).status_code == 303


@pytest.mark.parametrize(
    ("target", "safe"),
    [("/jobs?state=dead", "/jobs?state=dead"), ("//evil.example/", "/"),
     ("https://evil.example/", "/"), ("/\\evil.example", "/"), (None, "/")],
)  # fmt: skip
def test_after_a_login_or_an_action_only_a_path_here_is_followed(
    target: str | None, safe: str
) -> None:
    assert security.safe_next(target) == safe


def test_wrong_tokens_from_one_address_never_keep_the_right_token_out(client: Any) -> None:
    """Behind the documented SSH tunnel every login comes from 127.0.0.1: one wrong
    typist (or a guesser) paused everyone's logins for the rest of the minute."""
    client.get("/login")
    with client.session_transaction() as session:
        csrf = session["csrf"]
    wrong = {"token": "x" * 20, "name": "mallory", "csrf": csrf}
    free = security.FAILURES_PER_MINUTE
    answers = [client.post("/login", data=wrong).status_code for _ in range(free + 2)]
    assert answers == [200] * (free + 2)  # the form again, saying why; slower, not refused
    right = {"token": TOKEN, "name": "alice", "csrf": csrf}
    started = time.monotonic()
    assert client.post("/login", data=right).status_code == 303  # the same address gets in
    assert time.monotonic() - started < 2 * security.SLOWDOWN_SPACING + 1


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_past_the_free_failures_tokens_are_checked_a_second_apart_one_waiting() -> None:
    clock = _Clock()
    throttle = security.Throttle(clock=clock)
    for _ in range(security.FAILURES_PER_MINUTE):
        assert throttle.admit() == 0.0  # a few typos cost nothing
        throttle.failed()
    # From here on everyone's tokens are checked a second apart: a guesser gets one try
    # a second, and the right token waits its turn behind at most one other.
    assert throttle.admit() == 0.0
    assert throttle.admit() == 1.0  # waits for its turn...
    assert throttle.admit() is None  # ...and while it waits, others are refused at once
    clock.now += 1
    throttle.waited()
    assert throttle.admit() == 1.0  # the next turn
    throttle.waited()
    clock.now += 2
    assert throttle.admit() == 0.0  # its turn has come: checked at once
    clock.now += 61  # no wrong token in the last minute: no turns at all
    assert [throttle.admit() for _ in range(3)] == [0.0, 0.0, 0.0]
