"""The supervisor's store: the only caller of supervisor/queries.sql.

The parent holds no connection across a fork: each call opens a short, bounded
connection and closes it before returning.
"""

from __future__ import annotations

from collections.abc import Sequence

from forklift import _db, _sql
from forklift.store import translated


class SupervisorStore:
    def __init__(self, dsn: str, schema: str, timeouts: _db.Timeouts) -> None:
        self.dsn = dsn
        self.schema = schema
        self.timeouts = timeouts
        self.q = _sql.load("forklift.supervisor", "queries.sql", schema)

    def job_fail_orphaned(
        self,
        owner: str,
        error: str,
        *,
        ids: Sequence[int] | None = None,
        backoff_base: float = 0.5,
        backoff_max: float = 60.0,
    ) -> list[tuple[int, str, int]]:
        """Attribute a process death to the jobs `owner` held; return (id, state, attempts)."""
        params = {
            "owner": owner,
            "error": error,
            "ids": list(ids) if ids is not None else None,
            "backoff_base": backoff_base,
            "backoff_max": backoff_max,
        }
        with (
            translated("recording a worker's death failed"),
            _db.connect(self.dsn, self.timeouts, application_name="forklift-supervisor") as c,
        ):
            return [(r[0], r[1], r[2]) for r in c.execute(self.q["job_fail_orphaned"], params)]

    def job_release_owner(self, owner: str) -> list[int]:
        params = {"owner": owner, "channel": f"{self.schema}_jobs"}
        with (
            translated("releasing a worker's jobs failed"),
            _db.connect(self.dsn, self.timeouts, application_name="forklift-supervisor") as c,
        ):
            return [r[0] for r in c.execute(self.q["job_release_owner"], params)]

    def job_backlog(self, queues: Sequence[str], cap: int = 10_000) -> int:
        params = {"queues": list(queues), "cap": cap}
        with (
            translated("reading the backlog failed"),
            _db.connect(self.dsn, self.timeouts, application_name="forklift-supervisor") as c,
        ):
            row = c.execute(self.q["job_backlog"], params).fetchone()
        return int(row[0]) if row else 0
