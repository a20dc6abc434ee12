"""Every statement the dashboard runs, on every page, its live parts and its actions,
reads the jobs table through an index: recorded while the pages are served (Flask's test
client) on a table holding a day of retained finished jobs, then EXPLAINed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, cast

import psycopg
import pytest

from forklift import _db
from forklift.admin import Connector
from forklift.dashboard.config import DashboardConfig
from forklift.dashboard.reader import Reader
from forklift.dashboard.web import create_app
from forklift.store import Conn
from tests.integration.test_query_plans import FINISHED, explain, fill, seq_scans

TOKEN = "a-token-of-sixteen-or-more"


class Recording:
    """A connection that notes every statement (and its parameters) it executes, itself or
    through its cursors."""

    def __init__(self, conn: Conn, seen: list[tuple[str, Any]]) -> None:
        self._conn = conn
        self._seen = seen

    def execute(self, query: Any, params: Any = None, **kw: Any) -> Any:
        self._seen.append((str(query), params))
        return self._conn.execute(query, params, **kw)

    def cursor(self, *args: Any, **kw: Any) -> Any:
        return Recording(self._conn.cursor(*args, **kw), self._seen)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class Source:
    """The dashboard's pool, played by one recording connection."""

    def __init__(self, dsn: str) -> None:
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.seen: list[tuple[str, Any]] = []

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Conn]:
        yield cast(Conn, Recording(self.conn, self.seen))


@pytest.fixture
def filled(db: psycopg.Connection[Any], schema: str) -> tuple[int, int]:
    """A batch of finished and ready jobs, a supervisor and a worker running a job, a dead
    job with an error history (besides test_query_plans's day of finished jobs)."""
    fill(db, schema, FINISHED)
    batch = db.execute(
        f"INSERT INTO {schema}.batches (total, sealed_at, callback) VALUES (1500, now(),"
        """ '{"task": "assemble", "queue": "q0", "args": {}, "priority": 0, "max_attempts": 5,"""
        """ "max_crashes": 2, "timeout": null}') RETURNING id"""
    ).fetchone()
    assert batch is not None
    db.execute(
        f"UPDATE {schema}.jobs SET batch_id = %s WHERE id IN (SELECT id FROM {schema}.jobs"
        f" WHERE state IN ('succeeded', 'dead') ORDER BY id DESC LIMIT 1000)",
        (batch[0],),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET batch_id = %s WHERE id IN (SELECT id FROM {schema}.jobs"
        f" WHERE state = 'ready' ORDER BY id LIMIT 500)",
        (batch[0],),
    )
    db.execute(
        f"""INSERT INTO {schema}.processes (id, kind, host, pid, supervisor_id, queues)
        VALUES ('h:1:a', 'supervisor', 'h', 1, NULL, '{{q0}}'),
               ('host:1:w', 'worker', 'host', 1, 'h:1:a', '{{q0,q1}}')"""
    )
    dead = db.execute(
        f"""UPDATE {schema}.jobs SET errors = '[{{"attempt": 1, "at": "2026-01-01T00:00:00Z",
        "worker": "h:2:w", "error": "boom", "traceback": "Traceback"}}]'::jsonb
        WHERE id = (SELECT max(id) FROM {schema}.jobs WHERE state = 'dead') RETURNING id"""
    ).fetchone()
    assert dead is not None
    # A workflow of 300 ready and blocked jobs, each after the one before it.
    db.execute(f"INSERT INTO {schema}.workflows (name, total) VALUES ('nightly', 300)")
    db.execute(
        f"UPDATE {schema}.jobs AS j SET workflow_id = 1, step = 'step' || j.id,"
        f" state = CASE WHEN j.id = w.first THEN 'ready'::{schema}.job_state"
        f" ELSE 'blocked' END, waiting_on = CASE WHEN j.id = w.first THEN 0 ELSE 1 END"
        f" FROM (SELECT min(id) AS first FROM (SELECT id FROM {schema}.jobs"
        f" WHERE state = 'ready' AND batch_id IS NULL ORDER BY id LIMIT 300) AS f) AS w"
        f" WHERE j.id IN (SELECT id FROM {schema}.jobs WHERE state = 'ready'"
        f" AND batch_id IS NULL ORDER BY id LIMIT 300)"
    )
    db.execute(
        f"INSERT INTO {schema}.workflow_edges (upstream, dependent, workflow_id)"
        f" SELECT lag(id) OVER (ORDER BY id), id, 1 FROM {schema}.jobs"
        f" WHERE workflow_id = 1 ORDER BY id OFFSET 1"
    )
    db.execute(f"VACUUM ANALYZE {schema}.jobs")
    return batch[0], dead[0]


def test_no_dashboard_page_or_action_scans_the_jobs_table(
    dsn: str,
    db: psycopg.Connection[Any],
    schema: str,
    filled: tuple[int, int],
) -> None:
    batch, dead = filled
    source = Source(dsn)
    timeouts = _db.Timeouts(connect=2.0, statement=10.0, lock=2.0)
    reader = Reader(dsn, schema, Connector(dsn, timeouts, source))
    app = create_app(DashboardConfig("127.0.0.1", 0, True, TOKEN), reader)
    client = app.test_client()
    with client.session_transaction() as session:
        session["who"], session["csrf"] = "tester", "c"
    filters = [
        "", "?state=dead", "?state=ready&queue=q1", "?state=scheduled", "?queue=q2&task=t3",
        "?error=boom", "?state=succeeded&before=1000", "?state=running", "?state=cancelled",
    ]  # fmt: skip
    pages = [
        "/", "/live/", "/live/charts", *(f"/jobs{f}" for f in filters), "/live/jobs?state=dead",
        f"/jobs/{dead}", f"/live/jobs/{dead}", "/batches", "/live/batches", f"/batches/{batch}",
        f"/live/batches/{batch}", "/schedules", "/processes", "/live/processes",
        "/workflows", "/live/workflows", "/workflows/1", "/live/workflows/1",
    ]  # fmt: skip
    for path in pages:
        answer = client.get(path)
        assert answer.status_code == 200, (path, answer.text[-500:])
    actions = [
        ("/actions/retry", {"job": str(dead)}),
        ("/actions/cancel", {"job": str(FINISHED + 5)}),
        ("/actions/pause", {"queue": "q1"}),
        ("/actions/resume", {"queue": "q1"}),
        ("/actions/purge", {"state": "succeeded", "older_than": "7d"}),
        ("/actions/cancel-batch", {"batch": str(batch)}),
        ("/actions/cancel-workflow", {"workflow": "1"}),
    ]
    for path, form in actions:
        answer = client.post(path, data={**form, "csrf": "c", "next": "/"})
        assert answer.status_code == 303, (path, answer.text[-500:])
    source.conn.close()

    statements = {(sql, repr(params)): (sql, params) for sql, params in source.seen}
    assert len(statements) >= 30, len(statements)
    scanned = [
        (sql[:200], params)
        for sql, params in statements.values()
        if sql.lstrip().upper().startswith(("SELECT", "WITH", "UPDATE", "DELETE", "INSERT"))
        and "jobs" in set(seq_scans(explain(db, sql, params)))
    ]
    assert scanned == [], f"sequential scans of the jobs table: {scanned}"
