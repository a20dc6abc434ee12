"""The dashboard as a Flask app: its pages (pages.py), and with a token the login
(login.py), with --allow-actions the actions (actions.py); the checks every request
passes and the headers every answer carries (security.py); error pages.

Every `{{ value }}` in a template is escaped twice over: Jinja2's autoescape makes HTML
inert, and `finalize` first hides DSN passwords and shows control, bidi and zero-width
characters escaped (`\\x1b`, `\\u202e`), as the CLI does; tracebacks keep their line
breaks (`|lines`) and nothing else.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from flask import Flask, Response, abort, g, redirect, render_template, request, url_for
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from forklift import _db, _display
from forklift._events import emit
from forklift.dashboard import pages, security, views
from forklift.dashboard.config import DashboardConfig
from forklift.dashboard.reader import Reader
from forklift.errors import BatchNotFound, DatabaseError, JobNotFound
from forklift.shown import output

log = logging.getLogger(__name__)

LIVE_MS = 1000  # how often a page refreshes its live part
CHART_MS = 10_000  # and its charts (a minute's bar changes slowly)
PROCESSES_SHOWN = 30  # rows of processes on the overview (/processes has them all)
NAV = {
    "overview": "/",
    "jobs": "/jobs",
    "batches": "/batches",
    "workflows": "/workflows",
    "schedules": "/schedules",
    "processes": "/processes",
}
# What a visitor without a session may reach: the login, the static files, and /healthz
# (for a load balancer or the kubelet: the process answers; the database is the pages').
OPEN = ("login", "login_post", "static", "healthz")


class Lines(str):
    """Text already escaped for display that keeps its line breaks (a traceback)."""


# What redact() looks for (a URL's password, a password= pair); and printable ASCII, in
# which _display.line escapes nothing: text with neither passes as it is, at once.
_MAYBE_SECRET = re.compile(r"://|password", re.IGNORECASE)


def shown(value: Any) -> Any:
    """What `{{ value }}` prints, before HTML escaping: text with DSN passwords hidden
    and control, bidi and zero-width characters escaped; markup and numbers as they are."""
    if isinstance(value, Markup | Lines) or not isinstance(value, str):
        return value
    plain = value.isascii() and value.isprintable() and not _MAYBE_SECRET.search(value)
    if plain and not any(secret in value for secret in _db.secrets()):
        return value
    return _display.line(_db.redact(value))


def lines(value: Any) -> Lines:
    """`|lines`: like `shown`, but line breaks stay (a traceback in a <pre>)."""
    return Lines(_display.block(_db.redact(str(value))))


def create_app(config: DashboardConfig, reader: Reader) -> Flask:
    """The WSGI app: the pages and their `/live/` parts; with a token the login, with
    `config.allow_actions` the actions (without it there is no action endpoint at all)."""
    app = Flask(__name__)
    app.config.update(security.flask_settings(config.token))
    app.jinja_options = {**app.jinja_options, "finalize": shown}
    app.jinja_env.filters.update(
        lines=lines,
        age=output.age,
        clip=views.clip,
        percent=views.percent,
        when=output.when,
        fraction=output.fraction,
    )
    app.jinja_env.globals["by_host"] = views.by_host
    _guard(app, config)
    _errors(app)

    @app.context_processor
    def _context() -> dict[str, Any]:
        return {
            "actions": config.allow_actions,
            "login": config.token is not None,
            "logged_in": security.logged_in(),
            "csrf": security.csrf_token if config.token is not None else lambda: "",
            "where": reader.where,
            "pages": NAV,
            "live_ms": LIVE_MS,
            "chart_ms": CHART_MS,
            "processes_shown": PROCESSES_SHOWN,
        }

    pages.register(app, reader)
    app.add_url_rule("/healthz", "healthz", lambda: ("ok\n", 200, {"Content-Type": "text/plain"}))
    if config.token is not None:
        from forklift.dashboard import login

        login.register(app, config.token, security.Throttle())
    if config.allow_actions:
        from forklift.dashboard import actions

        actions.register(app, reader)
    return app


def _guard(app: Flask, config: DashboardConfig) -> None:
    """The checks before every request; the headers and Server-Timing after it."""

    @app.before_request
    def _start() -> Response | None:
        g.started = time.perf_counter()
        security.check_host(config.loopback)
        if request.method == "POST" and request.url_rule is not None:
            security.check_origin()
            security.check_csrf()
        needs_login = config.token is not None and request.endpoint not in OPEN
        return _to_login() if needs_login and not security.logged_in() else None

    @app.after_request
    def _finish(response: Response) -> Response:
        took = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
        response.headers["Server-Timing"] = f"app;dur={took:.1f}"
        return security.secured(response, static=request.endpoint == "static")


def _errors(app: Flask) -> None:
    @app.errorhandler(DatabaseError)
    def _database(exc: DatabaseError) -> tuple[str, int]:
        # The first line only: PostgreSQL's DETAIL may quote a row, arguments and all.
        first = str(exc).strip().split("\n", 1)[0]
        emit(log, "dashboard.database_error", logging.WARNING, error=first)
        return _error(503, f"the database did not answer: {first}")

    @app.errorhandler(JobNotFound)
    @app.errorhandler(BatchNotFound)
    def _missing(exc: Exception) -> tuple[str, int]:
        return _error(404, str(exc))

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> tuple[str, int] | HTTPException:
        if exc.code is None or exc.code < 400:
            return exc
        return _error(exc.code, exc.description or exc.name)


def _to_login() -> Response:
    if request.path.startswith("/live/"):
        abort(401, "logged out: reload the page")
    target = request.full_path.rstrip("?") if request.method == "GET" else "/"
    return redirect(url_for("login", next=target), 303)  # type: ignore[return-value]


def _error(code: int, message: str) -> tuple[str, int]:
    live = request.path.startswith("/live/")
    return render_template(
        "_error.html" if live else "error.html", code=code, message=message
    ), code
