"""Fakes for the supervisor's collaborators: no database, no fork, no real signals."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from forklift import _db
from forklift.admin import DEPTH_CAP, AdminStore, QueueStats
from forklift.backoff import Backoff
from forklift.errors import DatabaseError
from forklift.supervisor.child import Child, Children
from forklift.supervisor.store import ORPHAN_RETRY, ChargedJob, ReleasedJob, SupervisorStore


class FakeStore(SupervisorStore):
    """Records what the supervisor asked of the database; `down` makes every call fail."""

    def __init__(self) -> None:
        super().__init__("postgresql://unused", "forklift", _db.Timeouts())
        self.down = False
        self.calls: list[tuple[str, Any]] = []
        self.charged: list[ChargedJob] = [ChargedJob(1, "ready", 1, "default", "render")]
        self.released: list[ReleasedJob] = [ReleasedJob(2, "default", "render")]
        self.backlog = 0
        self.terminated: list[str] = []  # application names whose sessions were ended
        self.crash_flags: list[bool] = []  # each job_fail_orphaned's `crash`
        self.forgive_flags: list[bool] = []  # each job_fail_orphaned's `forgive`
        self.let_go: list[str] = []  # owners whose cancelled jobs' holds were ended

    def _call(self, name: str, *args: Any) -> None:
        if self.down:
            raise DatabaseError(f"{name}: the database is away")
        self.calls.append((name, args))

    def job_fail_orphaned(
        self,
        owner: str,
        error: str,
        *,
        ids: Sequence[int] | None = None,
        retry: Backoff | None = ORPHAN_RETRY,
        crash: bool = True,
        unlocked: bool = False,
        forgive: bool = False,
    ) -> list[ChargedJob]:
        self._call("job_fail_orphaned", owner, error, ids)
        self.crash_flags.append(crash)
        self.forgive_flags.append(forgive)
        return self.charged

    def job_let_go_cancelled(self, owner: str) -> int:
        if self.down:
            raise DatabaseError("job_let_go_cancelled: the database is away")
        self.let_go.append(owner)  # apart from `calls`: it goes with either of them
        return 0

    def job_release_owner(self, owner: str) -> list[ReleasedJob]:
        self._call("job_release_owner", owner)
        return self.released

    def job_backlog(self, queues: Sequence[str], cap: int = 10_000) -> int:
        self._call("job_backlog", tuple(queues))
        return self.backlog

    def backend_terminate(self, application_name: str) -> int:
        if self.down:
            raise DatabaseError("backend_terminate: the database is away")
        self.terminated.append(application_name)
        return 1


class FakeAdmin(AdminStore):
    def __init__(self) -> None:
        super().__init__("postgresql://unused", "forklift")
        self.down = False
        self.pings = 0
        self.stats: list[QueueStats] = []

    def ping(self) -> None:
        self.pings += 1
        if self.down:
            raise DatabaseError("database unreachable: it is away")

    def queue_stats(
        self,
        *,
        throughput: bool = True,
        hour: bool = True,
        include: Sequence[str] = (),
        cap: int = DEPTH_CAP,
    ) -> list[QueueStats]:
        if self.down:
            raise DatabaseError("reading queue statistics failed: it is away")
        return self.stats


class Signals:
    """What the supervisor would have sent: (pid, signal) pairs."""

    def __init__(self) -> None:
        self.sent: list[tuple[int, int]] = []

    def __call__(self, pid: int, signum: int) -> None:
        self.sent.append((pid, signum))


@pytest.fixture
def signals() -> Signals:
    return Signals()


@pytest.fixture
def children(signals: Signals) -> Children:
    return Children(send=signals)


@pytest.fixture
def store() -> FakeStore:
    return FakeStore()


def make_child(children: Children, pid: int, *, started: float = 0.0, **fields: Any) -> Child:
    """A child the parent never forked (its pipe is never read)."""
    child = Child(pid, len(children) + 1, f"host:{pid}:abc", -1, started, started, **fields)
    children.add(child)
    return child


OpenPipe = Callable[[], tuple[int, int]]


@pytest.fixture
def open_pipe() -> Iterator[OpenPipe]:
    """Make report pipes as the spawner does (the read end non-blocking); closed after."""
    fds: list[int] = []

    def make() -> tuple[int, int]:
        read_fd, write_fd = os.pipe()
        os.set_blocking(read_fd, False)
        fds.extend((read_fd, write_fd))
        return read_fd, write_fd

    yield make
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass  # the test closed it
