"""What the ops threads may know of the supervisor loop: an immutable copy, published per tick.

The loop builds a `Snapshot` once a tick and publishes it on the `SnapshotBoard`; the HTTP
endpoints and the registry heartbeat only ever read the board. Publishing is one attribute
assignment, atomic under the GIL, so no lock is needed and no live member of the loop is
read from another thread.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass

from forklift._ids import make_owner
from forklift.supervisor.child import Children
from forklift.supervisor.rss import rss_of
from forklift.supervisor.store import ProcessInfo
from forklift.workers.config import WorkerConfig


@dataclass(frozen=True)
class Identity:
    """Who this supervisor is in the process registry."""

    id: str
    host: str
    pid: int
    queues: str  # comma-separated, as the registry row takes them
    started: float  # monotonic
    labels: str = ""  # comma-separated, as queues (forklift run --labels)

    @classmethod
    def new(cls, worker: WorkerConfig, now: float) -> Identity:
        """This supervisor's, serving `worker`'s queues with its labels."""
        pid, host, queues = os.getpid(), socket.gethostname(), ",".join(worker.queues)
        return cls(make_owner(pid), host, pid, queues, now, ",".join(worker.labels))


@dataclass(frozen=True)
class Snapshot:
    """The loop's state as of `last_tick`."""

    last_tick: float
    supervisor_id: str = ""
    stopping: bool = False
    crash_loop: bool = False
    live_workers: int = 0  # children that count toward the target
    busy: int = 0  # children running a job
    idle: int = 0
    registry_rows: tuple[ProcessInfo, ...] = ()

    @property
    def ready(self) -> bool:
        return not self.stopping and not self.crash_loop and self.live_workers > 0


def take_snapshot(
    identity: Identity, children: Children, *, stopping: bool, crash_loop: bool, now: float
) -> Snapshot:
    busy = children.busy()
    return Snapshot(
        last_tick=now,
        supervisor_id=identity.id,
        stopping=stopping,
        crash_loop=crash_loop,
        live_workers=len(children.live()),
        busy=busy,
        idle=len(children) - busy,
        registry_rows=registry_rows(identity, children, now),
    )


def registry_rows(identity: Identity, children: Children, now: float) -> tuple[ProcessInfo, ...]:
    """This supervisor and its workers, as the process registry should show them."""
    me = identity
    rows = [
        ProcessInfo(
            me.id, "supervisor", me.host, me.pid, None, me.queues, None,
            rss_of(me.pid), now - me.started, me.labels,
        )
    ]  # fmt: skip
    rows += (
        ProcessInfo(
            c.owner, "worker", me.host, c.pid, me.id, me.queues, next(iter(c.jobs), None),
            c.rss or None, now - c.started, me.labels,
        )
        for c in children
    )  # fmt: skip
    return tuple(rows)


class SnapshotBoard:
    """Where the loop publishes its latest snapshot and the ops threads read it."""

    def __init__(self, first: Snapshot) -> None:
        self._latest = first

    def publish(self, snapshot: Snapshot) -> None:
        self._latest = snapshot

    def read(self) -> Snapshot:
        return self._latest
