"""What the database answers that no retry fixes: it refuses forklift's role or password
(SQLSTATE class 28) or has no such database (3D000), and what the supervisor does about it:
at boot, exit after a short grace with one line naming the cause; after boot, say it
loudly and let /readyz say why (the workers go on as soon as it is fixed).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from forklift import _db
from forklift._events import emit
from forklift._refused import refusal
from forklift.errors import ConfigError, DatabaseError

__all__ = ["BootCheck", "DatabaseRefused", "refusal"]

log = logging.getLogger(__name__)

WHERE = "--dsn, FORKLIFT_DATABASE_URL or DATABASE_URL"


class DatabaseRefused(DatabaseError):
    """The database refuses forklift for good (authentication, no such database)."""


class BootCheck:
    """Runs on the database thread until the database has answered once: refuses a
    pooler's URL with no session URL (ConfigError), and gives up on a database that
    refuses forklift for `grace` seconds (DatabaseRefused). A database that does not
    answer at all is waited for, never given up on. `fatal` is what the loop acts on."""

    def __init__(
        self,
        dsn: str,
        timeouts: _db.Timeouts,
        connection: Callable[[], AbstractContextManager[Any]],
        grace: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.dsn = dsn
        self.timeouts = timeouts
        self.connection = connection  # the database thread's own: connected here first
        self.grace = grace
        self.clock = clock
        self.answered = False
        self.fatal: ConfigError | DatabaseRefused | None = None
        self._since: float | None = None  # the first refusal of a run of them
        self._cause: str | None = None

    def run_once(self) -> None:
        if self.answered or self.fatal is not None:
            return
        try:
            _db.needs_session_url(self.dsn, self.timeouts, "forklift run")
            with self.connection():
                pass
        except ConfigError as exc:
            self.fatal = exc
            return
        except (DatabaseError, psycopg.Error) as exc:
            self._failed(exc)
            return
        self.answered = True

    def _failed(self, exc: Exception) -> None:
        cause = refusal(exc)
        if cause is None:  # not answering (yet): waited for, as before
            self._since = self._cause = None
            return
        now = self.clock()
        if self._since is None or cause != self._cause:
            self._since, self._cause = now, cause
            emit(
                log, "supervisor.database_refuses", logging.ERROR, error=cause,
                gives_up_in=round(self.grace, 1),
            )  # fmt: skip
        if now - self._since >= self.grace:
            self.fatal = DatabaseRefused(
                f"the database at {_db.describe(self.dsn)} refuses forklift: {cause} "
                f"(for {self.grace:g} s since the start; check the database URL: {WHERE})"
            )
