"""Who may see and do what on the dashboard: the token login, its session cookie, CSRF
tokens, the Host and Origin checks, and the headers every answer carries.

- With FORKLIFT_DASHBOARD_TOKEN set, every page asks for a login with it (and a name,
  recorded with each action); without it the pages are open to whoever reaches the
  address, and there are no actions at all (config.py refuses --allow-actions then).
- The session is Flask's signed cookie, HttpOnly and SameSite=Strict, signed with a key
  derived from the token: replicas with one token accept each other's sessions, and a
  new token ends every session.
- Every POST (login, logout, each action) carries the session's CSRF token, compared in
  constant time; a POST from another origin is refused before that.
- Bound to loopback, only a loopback Host header is answered, so a web page elsewhere
  cannot read the dashboard through a DNS name rebound to 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from urllib.parse import urlsplit

from flask import Response, abort, request, session

# No inline script or style anywhere: scripts and styles come from /static only.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}
SESSION_HOURS = 8
COOKIE = "forklift_dashboard"
NAME = re.compile(r"[A-Za-z0-9._-]{1,40}")  # who, as the error history records it
FAILURES_PER_MINUTE = 10  # wrong tokens a minute before every login waits its turn
SLOWDOWN_SPACING = 1.0  # seconds between two checked tokens past those
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def session_key(token: str | None) -> bytes:
    """The key the session cookie is signed with: from the token (replicas agree, a new
    token ends every session), random without one (no sessions are needed then)."""
    if token is None:
        return secrets.token_bytes(32)
    return hmac.new(token.encode(), b"forklift-dashboard-session", hashlib.sha256).digest()


def flask_settings(token: str | None) -> dict[str, object]:
    return {
        "SECRET_KEY": session_key(token),
        "SESSION_COOKIE_NAME": COOKIE,
        "SESSION_COOKIE_HTTPONLY": True,
        "SESSION_COOKIE_SAMESITE": "Strict",
        "PERMANENT_SESSION_LIFETIME": timedelta(hours=SESSION_HOURS),
        "MAX_CONTENT_LENGTH": 64 * 1024,
    }


class Throttle:
    """Wrong tokens slow every login down instead of locking anyone out. Addresses say
    nothing here: behind the documented SSH tunnel every login comes from 127.0.0.1,
    and keying on the address let one wrong typist keep everyone out.

    A few wrong tokens cost nothing. While `limit` or more came in the last minute,
    tokens are checked one at a time, `spacing` seconds apart, whoever sends them: a
    guesser gets one try a second (against a token of 16 characters or more), and the
    right token gets in after waiting its turn, a second or two. One attempt at a time
    may wait for its turn (the server has few threads, and a flood must not put them
    all to sleep); another arriving meanwhile is refused at once, to be tried again."""

    def __init__(
        self,
        limit: int = FAILURES_PER_MINUTE,
        spacing: float = SLOWDOWN_SPACING,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.spacing = spacing
        self._clock = clock
        self._lock = threading.Lock()
        self._failures: deque[float] = deque()  # the last `limit` wrong tokens' times
        self._next = 0.0  # when the next token may be checked
        self._waiting = False  # whether an attempt waits for its turn now

    def admit(self) -> float | None:
        """How long this attempt waits before its token is checked (0: at once); None:
        another attempt waits already, refuse this one. After a wait, call waited()."""
        with self._lock:
            now = self._clock()
            while self._failures and now - self._failures[0] > 60:
                self._failures.popleft()
            if len(self._failures) < self.limit:
                return 0.0
            wait = max(0.0, self._next - now)
            if wait > 0 and self._waiting:
                return None
            self._next = now + wait + self.spacing
            self._waiting = wait > 0
            return wait

    def waited(self) -> None:
        with self._lock:
            self._waiting = False

    def failed(self) -> None:
        with self._lock:
            self._failures.append(self._clock())
            if len(self._failures) > self.limit:
                self._failures.popleft()  # the oldest no longer changes anything


def token_matches(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def csrf_token() -> str:
    """This session's CSRF token (made on first use): every form carries it."""
    token = session.get("csrf")
    if not isinstance(token, str):
        token = session["csrf"] = secrets.token_urlsafe(32)
    return token


def check_csrf() -> None:
    """Refuse (403) a POST whose form does not carry this session's CSRF token."""
    expected = session.get("csrf")
    given = request.form.get("csrf", "")
    if not isinstance(expected, str) or not hmac.compare_digest(given.encode(), expected.encode()):
        abort(403, "missing or wrong CSRF token: reload the page and try again")


def check_origin() -> None:
    """Refuse (403) a POST that says it comes from another origin."""
    origin = request.headers.get("Origin")
    if origin is None:
        return  # older clients send none; the CSRF token still has to match
    if urlsplit(origin).netloc != request.host:  # "null" (an opaque origin) too
        abort(403, "cross-origin request refused")


def check_host(loopback: bool) -> None:
    """Bound to loopback: answer only a loopback Host (no DNS rebinding)."""
    if not loopback:
        return
    host = urlsplit(f"//{request.host}").hostname or ""
    try:
        ok = ipaddress.ip_address(host).is_loopback
    except ValueError:
        ok = host.lower() in LOOPBACK_NAMES
    if not ok:
        abort(421, "this dashboard answers only on a loopback address")


def logged_in() -> bool:
    return isinstance(session.get("who"), str)


def who() -> str:
    """Who acts, as the error history records it (`Retried by WHO`, no spaces):
    `dashboard:NAME@ADDRESS`."""
    return f"dashboard:{session.get('who')}@{request.remote_addr or '-'}"


def safe_next(target: str | None, default: str = "/") -> str:
    """Where to go after a login or an action: a path on this site, never elsewhere."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return default
    return target


def secured(response: Response, *, static: bool = False) -> Response:
    """`response` with the security headers; never cached, but for the static files."""
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    response.headers["Cache-Control"] = "max-age=300" if static else "no-store"
    return response
