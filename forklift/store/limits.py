"""The limit store: the only caller of the limit queries (store/limits.sql).

A claim under limits is one round trip of a pipelined transaction: take the limits'
locks (limit_lock), then claim in a fresh snapshot (job_claim_limited), which sees every
claim committed under them and none in flight. A claim with no limit to hold stays the
plain one-statement claim (JobStore.job_claim).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from psycopg.rows import dict_row

from forklift import _sql
from forklift._db import column, one, scalar, scalars
from forklift.limits import Limit
from forklift.store import ConnSource, translated
from forklift.store._boundary import pipelined
from forklift.store._rows import Claim, claimed

# A completion statement to run first in a claim's transaction: (query, params).
Completing = tuple[str, dict[str, Any]]


@dataclass(frozen=True)
class _Applies:
    """limits_apply's row: the limits a claim must hold, whether all may take the shared
    path, and whether jobs wait with the key of a limit there is none of."""

    limits: int
    shared: bool
    keyed_unlimited: bool
    fair: bool  # fair jobs wait in the queues (store/fair.sql)


class LimitStore:
    def __init__(self, pool: ConnSource, schema: str, where: str) -> None:
        self.pool = pool
        self.where = where
        self.q = _sql.load("forklift.store", "limits.sql", schema)
        self._declared: dict[str, Limit | None] = {}  # what `register` was given
        self._declared_at = 0.0  # when they were last declared (monotonic)
        self.fair_waiting = False  # fair jobs waited in the queues at the last apply()

    def apply(self, queues: Sequence[str], tasks: Sequence[str]) -> Applying:
        """Whether a claim of these queues and tasks has limits to hold (or jobs stored
        with the key of a limit there is none of any more), and whether they all may be
        held on the shared path. Also noted (`fair_waiting`): whether fair jobs wait in
        the queues, for a claim with no limit to hold to take them in turns."""
        if self._declared and time.monotonic() - self._declared_at >= DECLARE_EVERY:
            self._declare(boot=False)
        params = {"queues": list(queues), "tasks": list(tasks), **_LANES}
        with translated("limit lookup failed", self.where), self.pool.connection() as conn:
            row = one(conn.execute(self.q["limits_apply"], params), _Applies)
        self.fair_waiting = row is not None and row.fair
        if row is None or not (row.limits or row.keyed_unlimited):
            return Applying.NONE
        return Applying.SHARED if row.limits and row.shared else Applying.EXACT

    def claim(
        self,
        queues: Sequence[str],
        tasks: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        *,
        expired: bool,
        complete: Completing | None = None,
        after: Mapping[str, tuple[str, str]] | None = None,
    ) -> Claim:
        """Claim under the limits (the exact path), after completing `complete` in the
        same transaction (it sees the slots they free); also whether candidates were
        turned away (their keys just filled: claim again at once for what else is
        ready), and where its look at the keys ended in each queue (`after`, next
        time)."""
        params = _params(queues, tasks, owner, limit, lease, expired)
        looked = sorted((after or {}).items())
        params["after_queues"] = [q for q, _ in looked]
        params["after_tasks"] = [tk[0] for _, tk in looked]
        params["after_keys"] = [tk[1] for _, tk in looked]
        rows, completed, _ = self._pipelined("job_claim_limited", params, complete)
        jobs = claimed(rows)  # (one row of NULLs but `again` when nothing was taken)
        first = rows[0] if rows else {}
        ends = (first.get(c) or [] for c in ("after_queues", "after_tasks", "after_keys"))
        queues_, tasks_, keys_ = ends
        ended = dict(zip(queues_, zip(tasks_, keys_, strict=True), strict=True))
        again = any(r["again"] for r in rows)
        return Claim(jobs, again, completed, looked=ended, shared=bool(first.get("shared")))

    def claim_shared(
        self,
        queues: Sequence[str],
        tasks: Sequence[str],
        owner: str,
        limit: int,
        lease: float,
        *,
        expired: bool,
        complete: Completing | None = None,
    ) -> Claim:
        """Claim on the shared path (limits far from full: claims on different lanes do
        not wait for each other), after completing `complete` in the same transaction.
        `declined` (no lane free, or too close to a limit; `complete` is written all the
        same): claim on the exact path."""
        params = _params(queues, tasks, owner, limit, lease, expired, shared=True)
        rows, completed, exact = self._pipelined("job_claim_shared", params, complete, path=True)
        return Claim([] if exact else claimed(rows), False, completed, declined=exact)

    def _pipelined(
        self,
        claim: str,
        params: dict[str, Any],
        complete: Completing | None,
        *,
        path: bool = False,
    ) -> tuple[list[dict[str, Any]], set[int], bool]:
        """[complete;] lock; claim; [limit_path;] in one transaction and one round trip:
        the claim's rows (by column name), the ids completed, and whether the claim
        declined (limit_path, asked with `path`)."""
        statements: list[tuple[str, Any]] = [
            (self.q["limit_lock"], params),
            (self.q[claim], params),
        ]
        if complete is not None:
            statements[:0] = [(self.q["claim_completing"], None), complete]
        if path:
            statements.append((self.q["limit_path"], None))
        with translated("claim failed", self.where), self.pool.connection() as conn:
            cursors = pipelined(conn, statements)
            completed = set(column(cursors[1], "id")) if complete is not None else set()
            named = cursors[-2:] if path else cursors[-1:]  # the claim's, limit_path's
            for cursor in named:
                cursor.row_factory = dict_row
            rows = named[0].fetchall()
            said = named[1].fetchone() if path else None
        return rows, completed, bool(said and said["exact"])

    def wake_in(
        self, queues: Sequence[str], tasks: Sequence[str], since: float = 0.0
    ) -> float | None:
        """Seconds until a rate window of these limits that was full `since` seconds ago
        (when the claim ran) frees, or a delayed job is due; None if neither (a freed
        concurrency slot notifies)."""
        params = {"queues": list(queues), "tasks": list(tasks), "since": max(0.0, since)}
        with translated("limit lookup failed", self.where), self.pool.connection() as conn:
            wake_in = scalar(conn.execute(self.q["limit_wake"], params))
        return None if wake_in is None else float(wake_in)

    def stopping_renew(self, held: Sequence[tuple[int, int]], owner: str, lease: float) -> set[int]:
        """Extend the holds of cancelled jobs whose handlers still run at `owner`, as
        (id, attempt): their limits' slots stay taken. The ids renewed."""
        params = {
            "ids": [i for i, _ in held],
            "attempts": [a for _, a in held],
            "owner": owner,
            "lease": lease,
        }
        with translated("renewing holds failed", self.where), self.pool.connection() as conn:
            return set(scalars(conn.execute(self.q["job_stopping_renew"], params)))

    def stopping_let_go(self, job_id: int, attempt: int, owner: str) -> None:
        """A cancelled job's handler stopped at `owner`: its hold ends, its slots free."""
        params = {"id": job_id, "attempt": attempt, "owner": owner}
        with translated("ending a hold failed", self.where), self.pool.connection() as conn:
            conn.execute(self.q["job_stopping_let_go"], params)

    def register(self, limits: Mapping[str, Limit | None]) -> None:
        """Declare the task limits the code declares (a worker at boot): write them (the
        last worker to start wins where versions disagree); drop those of tasks that
        declare none, but only once no worker has declared them for STALE seconds (a
        rolling deploy's other version keeps its limits in force). `apply` declares them
        again every DECLARE_EVERY seconds. One short transaction per limit: never a lock
        held across a claim."""
        self._declared = dict(limits)
        self._declare(boot=True)

    def _declare(self, *, boot: bool) -> None:
        self._declared_at = time.monotonic()
        limits = self._declared
        with translated("limit registration failed", self.where), self.pool.connection() as conn:
            for name, limit in sorted(limits.items()):
                if limit is not None:
                    with conn.transaction():
                        conn.execute(self.q["limit_declare_lock"], {"name": name})
                        conn.execute(self.q["limit_register"], _declaring(name, limit, boot))
            gone = sorted(name for name, limit in limits.items() if limit is None)
            if gone:
                conn.execute(self.q["limit_unregister"], {"names": gone, "stale": STALE})


class Applying(enum.Enum):
    """Which claim a worker's queues and tasks need."""

    NONE = "none"  # no limit to hold: the plain claim
    EXACT = "exact"  # lock each limit, then count and claim
    SHARED = "shared"  # far from every limit: the shared path first


# A worker declares its tasks' limits again this often (seconds) while it claims; a
# limit no worker has declared for STALE seconds may be replaced by another version's, or
# dropped by a worker whose code declares none.
DECLARE_EVERY = 30.0
STALE = 600.0

# The shared path: this many claims at once, of at most this many jobs each.
LANES = 4
LANE_CLAIM = 256
_LANES = {"lanes": LANES, "lane_claim": LANE_CLAIM}
# The exact path walks the jobs under limits in line order this far past what it claims;
# past that (the keys in front full), it looks at the first jobs of other keys, KEYS of
# them a claim, each claim on from where the last ended: a claim's cost stays bounded
# however many jobs wait behind full keys, and however many keys there are.
VISIT = 64
KEYS = 32
# Jobs of a limited task stored with no key (enqueued before their producer knew the
# limit) are keyed this many past what a claim takes, a claim: a wall of them is soon
# gone from the plain index.
REKEY = 256


def _params(
    queues: Sequence[str], tasks: Sequence[str], owner: str, limit: int, lease: float,
    expired: bool, *, shared: bool = False,
) -> dict[str, Any]:  # fmt: skip
    return {
        "queues": list(queues), "tasks": list(tasks), "owner": owner, "limit": limit,
        "lease": lease, "expired": expired, "shared": shared, "visit": VISIT, "keys": KEYS,
        "rekey": REKEY, "labels": [],
        **_LANES,
    }  # fmt: skip


def _declaring(name: str, limit: Limit, boot: bool) -> dict[str, Any]:
    return {**_row(name, limit), "boot": boot, "fresh": DECLARE_EVERY, "stale": STALE}


def _row(name: str, limit: Limit) -> dict[str, Any]:
    return {
        "name": name,
        "concurrency": limit.concurrency,
        "rate": limit.rate,
        "per": float(limit.per) if limit.rate is not None else None,
        "keyed": limit.key is not None,
        "key_arg": limit.key_arg,
    }
