"""What the fault tests' apps (tests/apps/fair.py, tests/apps/unique.py) record of their
runs, written at once on a connection of its own in autocommit, so that a run killed
mid-way is recorded too."""

from __future__ import annotations

import os
import threading
from typing import Any

import psycopg

import forklift

_local = threading.local()


def _recorder(app: forklift.App, name: str) -> psycopg.Connection[Any]:
    """This thread's recording connection for `app`, opened in this process (never before
    a fork), to its database (the tests of both apps may run in one process)."""
    conn: psycopg.Connection[Any] | None = getattr(_local, "conn", None)
    mine = (os.getpid(), app.dsn, name)  # one app's, in this process
    if conn is None or conn.closed or getattr(_local, "key", None) != mine:
        conn = psycopg.connect(app.dsn, autocommit=True, connect_timeout=3, application_name=name)
        _local.conn, _local.key = conn, mine
    return conn


def write(app: forklift.App, name: str, sql: str, params: tuple[Any, ...]) -> None:
    """Run `sql` on the recorder (application_name `name`); once more on a fresh
    connection if the first broke (a database restart). Raises psycopg.Error if both
    fail."""
    try:
        _recorder(app, name).execute(sql, params)
    except psycopg.OperationalError:
        _local.conn = None
        _recorder(app, name).execute(sql, params)
