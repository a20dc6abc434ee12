"""The testing helpers' store: the only caller of testing/queries.sql, on a short bounded
connection per call or on a test's own connection; errors come out as DatabaseError."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import psycopg
from psycopg.rows import dict_row

from forklift import _db, _sql
from forklift.app import App
from forklift.store import Conn, translated
from forklift.task import Task

# The bounds of the helpers' own connections: a test's database answers at once.
TIMEOUTS = _db.Timeouts(connect=5.0, statement=10.0, lock=5.0)


@dataclass(frozen=True)
class EnqueuedJob:
    """A job waiting in the jobs table (ready: due now, or later), as `enqueued()` and
    `assert_enqueued()` give it."""

    id: int
    task: str
    queue: str
    args: dict[str, Any]
    priority: int
    attempts: int  # > 0: a retry, waiting for its backoff
    max_attempts: int
    idempotency_key: str | None
    available_at: datetime
    due_in: float  # seconds until it is due (0: due now)

    def __str__(self) -> str:
        when = f"due in {self.due_in:.0f} s" if self.due_in > 0 else "due now"
        retry = f", attempt {self.attempts + 1} of {self.max_attempts}" if self.attempts else ""
        return f"{self.task}#{self.id} queue={self.queue} args={shown(self.args)} ({when}{retry})"


class Listed(NamedTuple):
    """Up to a limit of the jobs a query matched, and how many it matched in all."""

    jobs: list[EnqueuedJob]
    total: int


class JobEnd(NamedTuple):
    """A job_ends row: how a job stands after a drain."""

    id: int
    state: str
    result: Any
    errors: list[dict[str, Any]]


def app_of(task: Task[Any, Any]) -> App:
    """The App that declared `task` (whose database and schema a helper works in)."""
    if not isinstance(task.app, App):
        raise TypeError(f"task {task.name!r} belongs to no forklift.App (it has {task.app!r})")
    return task.app


def shown(args: Mapping[str, Any], limit: int = 200) -> str:
    """Arguments as a test's message shows them: JSON, cut at `limit` characters."""
    text = json.dumps(args, sort_keys=True, default=repr, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 1] + "…"


class HelperStore:
    """The helpers' statements for one app's database and schema: on `conn` if given (a
    test's own connection, in whatever transaction it has open: what it has enqueued and
    not committed is seen), else on a connection of its own for each call."""

    def __init__(self, dsn: str, schema: str, conn: Conn | None = None) -> None:
        self.dsn = dsn
        self.schema = schema
        self.conn = conn
        self.q = _sql.load("forklift.testing", "queries.sql", schema)

    @contextmanager
    def _connection(self, what: str) -> Iterator[Conn]:
        with translated(what, _db.describe(self.dsn)):
            if self.conn is not None:
                yield self.conn
                return
            with _db.connect(self.dsn, TIMEOUTS, application_name="forklift-testing") as conn:
                yield conn

    def enqueued(self, task: str | None, args: str, queue: str | None, limit: int = 1000) -> Listed:
        """The ready jobs of `task` in `queue` (None: any) whose arguments hold `args`
        (a JSON object, as enqueue wrote it), oldest first."""
        params = {"task": task, "args": args, "queue": queue, "limit": limit}
        with self._connection("listing enqueued jobs failed") as conn:
            return _listed(conn.execute(self.q["job_enqueued_list"], params))

    def sample(self, task: str | None, limit: int = 5) -> Listed:
        """A few ready jobs, those of `task` first, and how many are ready in all."""
        with self._connection("listing enqueued jobs failed") as conn:
            params = {"task": task, "limit": limit}
            return _listed(conn.execute(self.q["job_enqueued_sample"], params))

    def due_queues(self, queue: str | None) -> list[str]:
        with self._connection("looking for due jobs failed") as conn:
            return _db.scalars(conn.execute(self.q["job_due_queues"], {"queue": queue}))

    def due_count(self, queue: str | None) -> int:
        with self._connection("counting due jobs failed") as conn:
            return int(_db.scalar(conn.execute(self.q["job_due_count"], {"queue": queue})))

    def make_due(self, queue: str | None) -> list[int]:
        """Make the ready jobs due later (in `queue`, None: any) due now; their ids."""
        with self._connection("making scheduled jobs due failed") as conn:
            return _db.scalars(conn.execute(self.q["job_make_due"], {"queue": queue}))

    def ends(self, ids: Sequence[int]) -> dict[int, JobEnd]:
        with self._connection("reading the drained jobs failed") as conn:
            found = _db.rows(conn.execute(self.q["job_ends"], {"ids": list(ids)}), JobEnd)
        return {end.id: end for end in found}


def _listed(cursor: psycopg.Cursor[Any]) -> Listed:
    """A listing's rows (EnqueuedJob's columns, and `total`), by column name."""
    cursor.row_factory = dict_row
    rows = cursor.fetchall()
    jobs = [EnqueuedJob(**{k: v for k, v in row.items() if k != "total"}) for row in rows]
    return Listed(jobs, int(rows[0]["total"]) if rows else 0)
