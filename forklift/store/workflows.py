"""The workflow store: the only caller of the workflow queries (store/workflows.sql).

What happens to a workflow job when one of its upstream jobs ends (released, cancelled,
brought back by a retry) is the triggers' of migration 0020, in the transaction that
moved the upstream job, whatever statement moved it: this module inserts graphs, grows
them, and reads them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from forklift import _db, _sql
from forklift.store._boundary import Conn, connected, translated
from forklift.store._inserts import column_values, stored
from forklift.store._rows import NewJob

PAGE = 5_000  # rows per statement when reading or cancelling a workflow's jobs


class Node(NamedTuple):
    """One job of a graph to insert: its step name, its row, and the steps (by place in
    the graph) it runs after, with whether it ignores their failure."""

    step: str
    job: NewJob
    after: tuple[int, ...]
    ignore_failure: bool


@dataclass(frozen=True, slots=True)
class WorkflowRow:
    """A workflow as stored, with its jobs counted by state, and the database's clock."""

    id: int
    name: str
    context: str
    total: int
    created_at: datetime
    cancelled_at: datetime | None
    cancelled_by: str | None
    finished_at: datetime | None
    outcome: str | None
    now: datetime
    counts: dict[str, int]

    @property
    def state(self) -> str:
        """Its outcome once finished, else 'running' ('cancelling' while a cancelled
        one's running steps stop)."""
        if self.outcome is not None:
            return self.outcome
        return "running" if self.cancelled_at is None else "cancelling"


@dataclass(frozen=True, slots=True)
class StepRow:
    """A workflow's job: its step, state, times, and the jobs it runs after (`after`;
    `ignoring`: those whose failure it does not mind)."""

    id: int
    step: str | None
    task: str
    queue: str
    state: str
    attempts: int
    waiting_on: int
    created_at: datetime
    started_at: datetime | None
    completed_at: datetime | None
    last_error: str | None
    upstream_failed: int | None
    after: list[int]
    ignoring: list[int]


@dataclass(frozen=True, slots=True)
class UpstreamRow:
    """An upstream job as its dependent's handler sees it (ctx.upstream)."""

    id: int
    step: str | None
    task: str
    state: str
    result: str | None
    last_error: str | None


class WorkflowStore:
    """Runs the workflow queries on connections from `connect`, or on a caller's."""

    def __init__(self, connect: Callable[[], AbstractContextManager[Conn]], schema: str) -> None:
        self.connect = connect
        self.schema = schema
        self.q = _sql.load("forklift.store", "workflows.sql", schema)
        self.reserve = _sql.load("forklift.store", "queries.sql", schema)["job_ids_reserve"]

    def _conn(self, what: str, conn: Conn | None = None) -> AbstractContextManager[Conn]:
        return connected(self.connect, what, conn)

    # -- making ------------------------------------------------------------------------

    def insert(
        self, name: str, context: dict[str, Any], nodes: Sequence[Node], conn: Conn
    ) -> tuple[int, list[int]]:
        """Insert a workflow and its graph in `conn`'s transaction (COPY for the jobs and
        the edges): its id, and its jobs' ids in the order of `nodes`."""
        with translated("inserting the workflow failed"):
            params = {"name": name, "context": json.dumps(context), "total": len(nodes)}
            workflow_id = int(_db.scalar(conn.execute(self.q["workflow_create"], params)))
            ids: list[int] = []
            while len(ids) < len(nodes):
                n = min(PAGE, len(nodes) - len(ids))
                ids += _db.scalars(conn.execute(self.reserve, {"n": n}))
            with conn.cursor().copy(self.q["workflow_copy"]) as copy:
                for new_id, node in zip(ids, nodes, strict=True):
                    state = "blocked" if node.after else "ready"
                    row = (workflow_id, node.step, len(node.after), state)
                    copy.write_row((new_id, *column_values(node.job), *row))
            with conn.cursor().copy(self.q["workflow_edges_copy"]) as copy:
                for new_id, node in zip(ids, nodes, strict=True):
                    for up in node.after:
                        copy.write_row((ids[up], new_id, node.ignore_failure, workflow_id))
        return workflow_id, [int(i) for i in ids]

    def grow(
        self, parent: int, owner: str, attempt: int, step: str, job: NewJob,
        after: Sequence[int], conn: Conn,
    ) -> int | None:  # fmt: skip
        """Add `step` to running job `parent`'s workflow (see workflow_grow); its id, None
        if `parent` is no longer this owner's."""
        params = {
            "parent": parent, "owner": owner, "attempt": attempt, "step": step,
            "job": json.dumps(stored(job)), "after": list(after),
        }  # fmt: skip
        with self._conn("adding to the workflow failed", conn) as c:
            found = _db.scalar(c.execute(self.q["workflow_grow"], params))
        return None if found is None else int(found)

    # -- reading -----------------------------------------------------------------------

    def upstream(self, job_id: int, conn: Conn) -> list[UpstreamRow]:
        with self._conn("reading the upstream jobs failed", conn) as c:
            return _db.rows(c.execute(self.q["workflow_upstream"], {"id": job_id}), UpstreamRow)

    def of_job(self, job_id: int, conn: Conn) -> tuple[int, str, dict[str, Any], str] | None:
        """The workflow job `job_id` is a step of: its id, name and context, and the
        job's step name; None if it is of none."""
        with self._conn("reading the workflow failed", conn) as c:
            row = c.execute(self.q["workflow_of_job"], {"id": job_id}).fetchone()
        return None if row is None else (int(row[0]), row[1], json.loads(row[2]), row[3] or "")

    def get(self, workflow_id: int, conn: Conn | None = None) -> WorkflowRow | None:
        with self._conn("reading the workflow failed", conn) as c:
            return _db.one(c.execute(self.q["workflow_get"], {"id": workflow_id}), WorkflowRow)

    def recent(self, limit: int, *, open_only: bool = False) -> list[WorkflowRow]:
        """Up to `limit` workflows, newest first."""
        params = {"limit": limit, "open": open_only}
        with self._conn("listing workflows failed") as c:
            return _db.rows(c.execute(self.q["workflow_list"], params), WorkflowRow)

    def steps(self, workflow_id: int, limit: int | None = None) -> list[StepRow]:
        """Its jobs in id order (the first `limit`, if given), a page at a time."""
        found: list[StepRow] = []
        after = 0
        while limit is None or len(found) < limit:
            page = PAGE if limit is None else min(PAGE, limit - len(found))
            params = {"id": workflow_id, "after": after, "limit": page}
            with self._conn("reading the workflow's jobs failed") as c:
                rows = _db.rows(c.execute(self.q["workflow_steps"], params), StepRow)
            found += rows
            if len(rows) < page:
                break
            after = rows[-1].id
        return found

    def open_job_ids(self, workflow_id: int) -> list[int]:
        found: list[int] = []
        while True:
            params = {"id": workflow_id, "after": found[-1] if found else 0, "limit": PAGE}
            with self._conn("reading the workflow's jobs failed") as c:
                page = _db.scalars(c.execute(self.q["workflow_open_jobs"], params))
            found += page
            if len(page) < PAGE:
                return found

    def counts(self, window: float) -> dict[str, int]:
        """Open workflows ('running'), and those finished in the last `window` seconds by
        outcome."""
        with self._conn("counting workflows failed") as c:
            rows = c.execute(self.q["workflow_counts"], {"window": window}).fetchall()
        return {str(state): int(n) for state, n in rows}

    # -- acting ------------------------------------------------------------------------

    def mark_cancelled(self, workflow_id: int, by: str) -> bool:
        """Mark it cancelled; False if it finished or was cancelled already, or had no
        job open (it is finished now, as it would have been by the sweep)."""
        with self._conn("cancelling the workflow failed") as c:
            params = {"id": workflow_id, "by": by}
            row = c.execute(self.q["workflow_cancel"], params).fetchone()
        return bool(row and row[0])

    def sweep(self, after: int, limit: int) -> tuple[list[int], int]:
        """Finish the done ones of up to `limit` open workflows after `after`: the ids
        looked at, and how many were finished."""
        with self._conn("sweeping workflows failed") as c:
            rows = c.execute(self.q["workflow_sweep"], {"after": after, "limit": limit}).fetchall()
        return [int(r[0]) for r in rows], sum(bool(r[1]) for r in rows)

    def prune(self, keep: float, limit: int = 2000) -> int:
        with self._conn("pruning workflows failed") as c:
            return c.execute(self.q["workflow_prune"], {"keep": keep, "limit": limit}).rowcount
