"""The dashboard's pages: a Flask app whose views read through `Reader` (forklift.admin)
and render Jinja2 templates, each page with a `/live/...` twin that renders only the
part the browser refreshes every second.

Every `{{ value }}` in a template is escaped twice over: Jinja2's autoescape makes HTML
inert, and `finalize` first hides DSN passwords and shows control, bidi and zero-width
characters escaped (`\\x1b`, `\\u202e`), as the CLI does; tracebacks keep their line
breaks (`|lines`) and nothing else.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, abort, g, redirect, render_template, request, url_for
from markupsafe import Markup
from werkzeug.exceptions import HTTPException

from forklift import _db, _display
from forklift._events import emit
from forklift.admin.rows import JobFilter
from forklift.cli import jobs as jobs_cli
from forklift.cli import output
from forklift.dashboard import charts, security, views
from forklift.dashboard.config import DashboardConfig
from forklift.dashboard.reader import LIST_WINDOW, PAGE, Reader
from forklift.errors import BatchNotFound, DatabaseError, JobNotFound

log = logging.getLogger(__name__)

LIVE_MS = 1000  # how often a page refreshes its live part
CHART_MS = 10_000  # and its charts (a minute's bar changes slowly)
FILTER_CHARS = 200  # the longest filter value a /jobs query may carry
PAGES = {
    "overview": "/",
    "jobs": "/jobs",
    "batches": "/batches",
    "schedules": "/schedules",
    "processes": "/processes",
}


class Lines(str):
    """Text already escaped for display that keeps its line breaks (a traceback)."""


def shown(value: Any) -> Any:
    """What `{{ value }}` prints, before HTML escaping: text with DSN passwords hidden
    and control, bidi and zero-width characters escaped; markup and numbers as they are."""
    if isinstance(value, Markup | Lines) or not isinstance(value, str):
        return value
    return _display.line(_db.redact(value))


def lines(value: Any) -> Lines:
    """`|lines`: like `shown`, but line breaks stay (a traceback in a <pre>)."""
    return Lines(_display.block(_db.redact(str(value))))


def create_app(config: DashboardConfig, reader: Reader) -> Flask:
    """The WSGI app: the pages, `/live/` fragments, and with `config.allow_actions` the
    login and the actions (without it there are no action endpoints at all)."""
    app = Flask(__name__)
    app.config.update(security.flask_settings(config.token))
    app.jinja_options = {**app.jinja_options, "finalize": shown}
    app.jinja_env.filters.update(
        lines=lines,
        age=output.age,
        clip=views.clip,
        percent=views.percent,
        when=output.when,
    )
    app.jinja_env.globals["by_host"] = views.by_host
    guard = security.Throttle()

    @app.before_request
    def _start() -> Response | None:
        g.started = time.perf_counter()
        security.check_host(config.loopback)
        if request.method == "POST" and request.url_rule is not None:
            security.check_origin()
            security.check_csrf()
        open_ = request.endpoint in ("login", "login_post", "static")
        if config.token is not None and not open_ and not security.logged_in():
            return _to_login()
        return None

    @app.after_request
    def _finish(response: Response) -> Response:
        took = (time.perf_counter() - g.get("started", time.perf_counter())) * 1000
        response.headers["Server-Timing"] = f"app;dur={took:.1f}"
        return security.secured(response)

    @app.context_processor
    def _context() -> dict[str, Any]:
        return {
            "actions": config.allow_actions,
            "login": config.token is not None,
            "logged_in": security.logged_in(),
            "csrf": security.csrf_token if config.token is not None else lambda: "",
            "where": reader.where,
            "pages": PAGES,
            "live_ms": LIVE_MS,
            "chart_ms": CHART_MS,
        }

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

    def page(rule: str, name: str, view: Callable[..., str]) -> None:
        """`rule` for the page, `/live` + `rule` for its live part."""
        app.add_url_rule(rule, name, view, defaults={"live": False})
        app.add_url_rule(f"/live{rule}", f"{name}_live", view, defaults={"live": True})

    def overview(live: bool) -> str:
        data = reader.overview()
        if live:
            return render_template("_overview.html", o=data)
        return render_template(
            "overview.html", o=data, charts=charts.charts(reader.chart()), page="overview"
        )

    def chart() -> str:
        return render_template("_charts.html", charts=charts.charts(reader.chart()))

    def jobs(live: bool) -> str:
        where = _job_filter()
        before = _int_arg("before")
        found = reader.job_list(where, before)
        args = {k: v for k, v in vars(where).items() if v is not None}
        older = None
        if found.next_before is not None:
            older = url_for("jobs", **args, before=found.next_before)
        return render_template(
            "_jobs.html" if live else "jobs.html", where=where, found=found,
            states=jobs_cli.STATES, window=LIST_WINDOW, short=len(found.jobs) < PAGE,
            live_url=None if before is not None else url_for("jobs_live", **args),
            newest=None if before is None else url_for("jobs", **args), older=older,
            page="jobs",
        )  # fmt: skip

    def job(job_id: int, live: bool) -> str:
        view = views.job_view(reader.job(job_id))
        return render_template("_job.html" if live else "job.html", v=view, page="jobs")

    def batches(live: bool) -> str:
        open_, finished = reader.batch_list()
        return render_template(
            "_batches.html" if live else "batches.html", open=open_, finished=finished,
            views=views, page="batches",
        )  # fmt: skip

    def batch(batch_id: int, live: bool) -> str:
        d = reader.batch(batch_id)
        return render_template(
            "_batch.html" if live else "batch.html", d=d, s=d.summary, views=views,
            page="batches",
        )  # fmt: skip

    def schedules(live: bool) -> str:
        from forklift.cli.schedules import DECLARED_WITHIN, as_json

        rows = [(r, as_json(r)) for r in reader.schedules()]
        return render_template(
            "_schedules.html" if live else "schedules.html", rows=rows,
            declared_within=DECLARED_WITHIN, page="schedules",
        )  # fmt: skip

    def processes(live: bool) -> str:
        data = reader.processes()
        return render_template(
            "_processes.html" if live else "processes.html", p=data, page="processes"
        )

    page("/", "overview", overview)
    app.add_url_rule("/live/charts", "charts", chart)
    page("/jobs", "jobs", jobs)
    page("/jobs/<int:job_id>", "job", job)
    page("/batches", "batches", batches)
    page("/batches/<int:batch_id>", "batch", batch)
    page("/schedules", "schedules", schedules)
    page("/processes", "processes", processes)
    if config.token is not None:
        from forklift.dashboard import login

        login.register(app, config.token, guard)
    if config.allow_actions:
        from forklift.dashboard import actions

        actions.register(app, reader)
    return app


def _to_login() -> Response:
    target = request.full_path.rstrip("?") if request.method == "GET" else "/"
    if request.path.startswith("/live/"):
        abort(401, "logged out: reload the page")
    return redirect(url_for("login", next=target), 303)  # type: ignore[return-value]


def _error(code: int, message: str) -> tuple[str, int]:
    if request.path.startswith("/live/"):
        return render_template("_error.html", code=code, message=message), code
    return render_template("error.html", code=code, message=message), code


def _int_arg(name: str) -> int | None:
    text = request.args.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or len(text) > 19:
        abort(400, f"{name} must be a job id")
    return int(text)


def _text_arg(name: str) -> str | None:
    text = request.args.get(name, "").strip()
    if len(text) > FILTER_CHARS:
        abort(400, f"{name} may be at most {FILTER_CHARS} characters")
    return text or None


def _job_filter() -> JobFilter:
    state = _text_arg("state")
    if state is not None and state not in jobs_cli.STATES:
        abort(400, f"state must be one of {', '.join(jobs_cli.STATES)}")
    return JobFilter(state, _text_arg("queue"), _text_arg("task"), _text_arg("error"))
