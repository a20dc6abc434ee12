"""How the operator's stores reach the database: a short bounded connection per call, a
held one (the supervisor's database thread's) or a pool's (the dashboard's), or, inside
`session()`, one connection held for the block (a `forklift top` refresh, a dashboard
page)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Protocol

from forklift import _db
from forklift.store import Conn, short_connection, translated


class Source(Protocol):
    """Where held connections come from: a HeldConnection or a psycopg pool."""

    def connection(self, timeout: float | None = None) -> AbstractContextManager[Conn]: ...


class Connector:
    """Connections for one or more operator stores; a session is per thread."""

    def __init__(self, dsn: str, timeouts: _db.Timeouts, kept: Source | None = None) -> None:
        self.dsn = dsn
        self.timeouts = timeouts
        self.kept = kept  # the supervisor's held connection, or the dashboard's pool
        self._local = threading.local()

    def conn(self, what: str) -> AbstractContextManager[Conn]:
        """A connection for one call; errors become DatabaseError saying `what` failed."""
        held: Conn | None = getattr(self._local, "held", None)
        if held is not None:
            return _reused(held, what, _db.describe(self.dsn))
        if self.kept is not None:
            return _kept(self.kept, what, _db.describe(self.dsn))
        return short_connection(self.dsn, self.timeouts, "forklift-admin", what)

    @contextmanager
    def session(self, what: str) -> Iterator[None]:
        """Every call of this thread inside the block shares one connection (a session
        inside another shares the outer one)."""
        if getattr(self._local, "held", None) is not None:
            yield
            return
        with self._open(what) as conn:
            self._local.held = conn
            try:
                yield
            finally:
                self._local.held = None

    def _open(self, what: str) -> AbstractContextManager[Conn]:
        if self.kept is not None:
            return _kept(self.kept, what, _db.describe(self.dsn))
        return short_connection(self.dsn, self.timeouts, "forklift-admin", what)


@contextmanager
def _kept(kept: Source, what: str, where: str) -> Iterator[Conn]:
    with translated(what, where), kept.connection() as conn:
        yield conn


@contextmanager
def _reused(conn: Conn, what: str, where: str) -> Iterator[Conn]:
    with translated(what, where):
        yield conn
