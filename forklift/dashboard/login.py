"""The login with FORKLIFT_DASHBOARD_TOKEN, and the logout: the only way to a session."""

from __future__ import annotations

import logging
import time

from flask import Flask, Response, redirect, render_template, request, session, url_for

from forklift._events import emit
from forklift.dashboard import security

log = logging.getLogger(__name__)


def register(app: Flask, token: str, throttle: security.Throttle) -> None:
    @app.get("/login", endpoint="login")
    def login_form() -> str:
        return render_template("login.html", next=security.safe_next(request.args.get("next")))

    @app.post("/login", endpoint="login_post")
    def login() -> Response | tuple[str, int]:
        target = security.safe_next(request.form.get("next"))
        name = request.form.get("name", "").strip()
        given = request.form.get("token", "")
        client = request.remote_addr or "-"
        if not security.NAME.fullmatch(name):
            return _again("your name: 1 to 40 letters, digits, '.', '_' or '-'", target)
        wait = throttle.admit()
        if wait is None:
            emit(log, "dashboard.login_refused", logging.WARNING, reason="throttled",
                 client=client)  # fmt: skip
            return _again("too many wrong tokens lately: try again in a second", target, 429)
        if wait:
            try:
                time.sleep(wait)  # its turn: past a few wrong tokens, one check a second
            finally:
                throttle.waited()
        if not security.token_matches(given, token):
            throttle.failed()
            emit(log, "dashboard.login_refused", logging.WARNING, reason="wrong token",
                 client=client)  # fmt: skip
            return _again("wrong token", target)
        session.clear()  # a fresh session, a fresh CSRF token: nothing carries over
        session.permanent = True
        session["who"] = name
        security.csrf_token()
        emit(log, "dashboard.login", who=security.who())
        return redirect(target, 303)  # type: ignore[return-value]

    @app.post("/logout", endpoint="logout")
    def logout() -> Response:
        emit(log, "dashboard.logout", who=security.who())
        session.clear()
        return redirect(url_for("login"), 303)  # type: ignore[return-value]


def _again(message: str, target: str, code: int = 200) -> tuple[str, int]:
    """The login form again, saying why (200: a form shown again, as browsers expect)."""
    return render_template("login.html", next=target, refused=message), code
