"""The limit store: the only caller of the limit queries (store/limits.sql).

A claim under limits is one round trip of a pipelined transaction: lock the limits'
rows (limit_lock), then claim in a fresh snapshot (job_claim_limited), which sees every
claim committed under them and none in flight. A claim with no limit to hold stays the
plain one-statement claim (JobStore.job_claim).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

from forklift import _sql
from forklift.limits import Limit
from forklift.store import ConnSource, translated
from forklift.store._rows import ClaimedJob, claimed


class LimitStore:
    def __init__(self, pool: ConnSource, schema: str, where: str) -> None:
        self.pool = pool
        self.where = where
        self.q = _sql.load("forklift.store", "limits.sql", schema)

    def apply(self, queues: Sequence[str], tasks: Sequence[str]) -> Applying:
        """Whether a claim of these queues and tasks has limits to hold, and whether they
        all may be held on the shared path."""
        params = {"queues": list(queues), "tasks": list(tasks), **_LANES}
        with translated("limit lookup failed", self.where), self.pool.connection() as conn:
            row = conn.execute(self.q["limits_apply"], params).fetchone()
        if row is None or not row[0]:
            return Applying.NONE
        return Applying.SHARED if row[1] else Applying.EXACT

    def claim(
        self,
        queues: Sequence[str],
        tasks: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        *,
        expired: bool,
    ) -> tuple[list[ClaimedJob], bool]:
        """Claim under the limits (the exact path); also whether candidates were turned
        away (their keys just filled: claim again at once for what else is ready)."""
        params = _params(queues, tasks, owner, limit, lease, expired)
        rows, _ = self._pipelined("job_claim_limited", params)
        return claimed(rows), any(r[11] for r in rows)

    def claim_shared(
        self,
        queues: Sequence[str],
        tasks: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        *,
        expired: bool,
    ) -> list[ClaimedJob] | None:
        """Claim on the shared path (limits far from full: claims on different lanes do
        not wait for each other); None when it declined (no lane free, or too close to a
        limit): claim on the exact path."""
        params = _params(queues, tasks, owner, limit, lease, expired, shared=True)
        rows, exact = self._pipelined("job_claim_shared", params, "limit_path")
        return None if exact else claimed(rows)

    def _pipelined(
        self, claim: str, params: dict[str, Any], after: str | None = None
    ) -> tuple[list[Any], bool]:
        """BEGIN; lock; claim; [after;] COMMIT in one round trip (BEGIN and COMMIT as
        statements of the pipeline: psycopg's transaction() would wait for its BEGIN)."""
        with translated("claim failed", self.where), self.pool.connection() as conn:
            try:
                with conn.pipeline():
                    conn.execute("BEGIN")
                    conn.execute(self.q["limit_lock"], params)
                    cur = conn.execute(self.q[claim], params)
                    said = conn.execute(self.q[after]) if after is not None else None
                    conn.execute("COMMIT")
                rows = cur.fetchall()
                flag = said.fetchone() if said is not None else None
            except BaseException:
                conn.rollback()  # a failed statement left the transaction open (aborted)
                raise
        return rows, bool(flag and flag[0])

    def wake_in(self, queues: Sequence[str], tasks: Sequence[str]) -> float | None:
        """Seconds until a full rate window of these limits frees or a delayed job is
        due; None if neither (a freed concurrency slot notifies)."""
        params = {"queues": list(queues), "tasks": list(tasks)}
        with translated("limit lookup failed", self.where), self.pool.connection() as conn:
            row = conn.execute(self.q["limit_wake"], params).fetchone()
        return None if row is None or row[0] is None else float(row[0])

    def register(self, limits: Mapping[str, Limit | None]) -> None:
        """Write the task limits the code declares; drop those of tasks that declare none
        (one autocommit statement each: never a lock held across two)."""
        with translated("limit registration failed", self.where), self.pool.connection() as conn:
            gone = [name for name, limit in limits.items() if limit is None]
            for name, limit in sorted(limits.items()):
                if limit is not None:
                    conn.execute(self.q["limit_windows_reset"], _row(name, limit))
                    conn.execute(self.q["limit_register"], _row(name, limit))
            if gone:
                conn.execute(self.q["limit_unregister"], {"names": gone})


class Applying(enum.Enum):
    """Which claim a worker's queues and tasks need."""

    NONE = "plain"  # no limit: the plain claim
    EXACT = "exact"  # lock each limit, then count and claim
    SHARED = "shared"  # far from every limit: the shared path first


# The shared path: this many claims at once, of at most this many jobs each.
LANES = 4
LANE_CLAIM = 256
_LANES = {"lanes": LANES, "lane_claim": LANE_CLAIM}


def _params(
    queues: Sequence[str], tasks: Sequence[str], owner: str, limit: int, lease: float,
    expired: bool, *, shared: bool = False,
) -> dict[str, Any]:  # fmt: skip
    return {
        "queues": list(queues), "tasks": list(tasks), "owner": owner, "limit": limit,
        "lease": lease, "expired": expired, "shared": shared, **_LANES,
    }  # fmt: skip


def _row(name: str, limit: Limit) -> dict[str, Any]:
    return {
        "name": name,
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "per": float(limit.per) if limit.rate is not None else None,
        "keyed": limit.key is not None,
        "key_arg": limit.key_arg,
    }
