"""The process registry's heartbeat: this supervisor's rows in, silent processes out.

Every few seconds, and at once when a child comes or goes (on the supervisor's database
thread), it writes the rows of the latest snapshot, forgets this supervisor's workers that
are gone, and drops the rows of any process that stopped heart-beating. The registry is
for display (`forklift ps`, top) and for the claims under a limit, which share its slots
among the live workers it lists; a late heartbeat charges no job: deaths.py decides who
is dead.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from forklift._events import emit
from forklift._service import TestSignal
from forklift.errors import DatabaseError
from forklift.supervisor.snapshot import Snapshot, SnapshotBoard
from forklift.supervisor.store import SupervisorStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegistryConfig:
    every: float = 5.0  # seconds between heartbeats
    stale_after: float = 20.0  # a process silent this long leaves the registry's display


@dataclass(frozen=True)
class HeartbeatResult:
    rows_written: int
    processes_pruned: int


class ProcessRegistry:
    def __init__(
        self,
        store: SupervisorStore,
        board: SnapshotBoard,
        config: RegistryConfig | None = None,
    ) -> None:
        self.store = store
        self.board = board
        self.config = config or RegistryConfig()
        self.beat = TestSignal[HeartbeatResult]()  # each finished heartbeat, for tests
        self._listed: frozenset[str] = frozenset()  # the processes of the last changed()

    def changed(self, snapshot: Snapshot) -> bool:
        """Whether this snapshot's processes differ from the last one asked about: a
        heartbeat then should not wait its interval (claims under a limit share its slots
        among the live workers the registry lists)."""
        listed = frozenset(r.id for r in snapshot.registry_rows)
        if listed == self._listed:
            return False
        self._listed = listed
        return True

    def run_once(self) -> HeartbeatResult:
        """One heartbeat (DatabaseError if the database is away)."""
        snapshot = self.board.read()
        rows = snapshot.registry_rows
        self.store.process_upsert_many(rows)
        self.store.process_forget(snapshot.supervisor_id, [r.id for r in rows])
        pruned = self.store.process_prune_stale(self.config.stale_after)
        for process_id in pruned:
            emit(log, "registry.pruned", process=process_id)
        result = HeartbeatResult(len(rows), len(pruned))
        self.beat.emit(result)
        return result

    def deregister(self) -> None:
        """Remove this supervisor and its workers from the registry (best effort)."""
        supervisor_id = self.board.read().supervisor_id
        if not supervisor_id:
            return  # never registered
        try:
            self.store.process_forget(supervisor_id, [])
        except DatabaseError:
            pass  # they age out: other replicas prune them after stale_after
