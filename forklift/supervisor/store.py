"""The supervisor's store: the only caller of supervisor/queries.sql.

The parent holds no connection across a fork: each call opens a short, bounded
connection and closes it before returning.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg

from forklift import _db, _sql
from forklift.store import short_connection


class Charged(NamedTuple):
    id: int
    state: str
    attempts: int
    queue: str
    task: str


class Released(NamedTuple):
    id: int
    queue: str
    task: str


@dataclass(frozen=True)
class ProcessInfo:
    """One row of the process registry, as this supervisor reports it."""

    id: str
    kind: str
    host: str
    pid: int
    supervisor_id: str | None
    queues: str
    current_job: int | None
    rss_bytes: int | None
    uptime: float


class SupervisorStore:
    def __init__(self, dsn: str, schema: str, timeouts: _db.Timeouts) -> None:
        self.dsn = dsn
        self.schema = schema
        self.timeouts = timeouts
        self.q = _sql.load("forklift.supervisor", "queries.sql", schema)

    def _conn(self, what: str) -> AbstractContextManager[psycopg.Connection[Any]]:
        return short_connection(self.dsn, self.timeouts, "forklift-supervisor", what)

    def job_fail_orphaned(
        self,
        owner: str,
        error: str,
        *,
        ids: Sequence[int] | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 60.0,
    ) -> list[Charged]:
        """Charge a process death to the jobs `owner` held (all, or just `ids`)."""
        params = {
            "owner": owner,
            "error": error,
            "ids": list(ids) if ids is not None else None,
            "backoff_base": backoff_base,
            "backoff_max": backoff_max,
            "channel": f"{self.schema}_jobs",
        }
        with self._conn("recording a worker's death failed") as c:
            return [Charged(*r) for r in c.execute(self.q["job_fail_orphaned"], params)]

    def job_release_owner(self, owner: str) -> list[Released]:
        params = {"owner": owner, "channel": f"{self.schema}_jobs"}
        with self._conn("releasing a worker's jobs failed") as c:
            return [Released(*r) for r in c.execute(self.q["job_release_owner"], params)]

    def job_backlog(self, queues: Sequence[str], cap: int = 10_000) -> int:
        params = {"queues": list(queues), "cap": cap}
        with self._conn("reading the backlog failed") as c:
            row = c.execute(self.q["job_backlog"], params).fetchone()
        return int(row[0]) if row else 0

    def process_upsert_many(self, rows: Sequence[ProcessInfo]) -> None:
        fields = ProcessInfo.__dataclass_fields__
        params = {name: [getattr(r, name) for r in rows] for name in fields}
        with self._conn("process heartbeat failed") as c:
            c.execute(self.q["process_upsert_many"], params)

    def process_forget(self, supervisor_id: str, keep: Sequence[str]) -> None:
        params = {"supervisor_id": supervisor_id, "keep": list(keep)}
        with self._conn("process deregistration failed") as c:
            c.execute(self.q["process_forget"], params)

    def process_prune_stale(self, stale: float) -> tuple[list[str], list[Charged]]:
        """Drop processes silent for `stale` seconds; charge their workers' jobs."""
        with self._conn("pruning stale processes failed") as c:
            params = {"stale": stale, "channel": f"{self.schema}_jobs"}
            rows = c.execute(self.q["process_prune_stale"], params).fetchall()
        pruned = [r[1] for r in rows if r[0] == "process"]
        charged = [Charged(int(r[1]), r[2], 0, r[3], r[4]) for r in rows if r[0] == "job"]
        return pruned, charged
