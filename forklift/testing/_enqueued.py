"""enqueued(), assert_enqueued() and refute_enqueued(): the jobs waiting in an app's jobs
table (ready: due now, or later), as a test asks about them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forklift import _json
from forklift.app import App
from forklift.store import Conn
from forklift.task import Task
from forklift.testing._store import EnqueuedJob, HelperStore, Listed, app_of
from forklift.testing.processes import WaitTimedOut, wait_for

# How many jobs a failed assertion lists.
SHOWN = 5


@dataclass(frozen=True)
class Wanted:
    """The jobs a test asks about: of `task`, in `queue` (None: any), whose arguments hold
    `args` (a JSON object as enqueue stores it: `{}` holds for any)."""

    store: HelperStore
    task: str | None
    args: str
    queue: str | None

    @classmethod
    def of(
        cls,
        app: App | Task[Any, Any],
        task: Task[Any, Any] | str | None,
        args: Mapping[str, Any] | None,
        queue: str | None,
        conn: Conn | None,
    ) -> Wanted:
        if isinstance(app, Task):
            if task is not None:
                raise TypeError("give the task once: assert_enqueued(task, ...) or (app, task)")
            task, app = app, app_of(app)
        name = task.name if isinstance(task, Task) else task
        # Encoded as enqueue encodes arguments, so that what a test passes compares
        # equal to what was stored (a tuple to a list, say).
        text = _json.dumps_args({} if args is None else args, app.max_arg_bytes)
        return cls(HelperStore(app.dsn, app.schema, conn), name, text, queue)

    def matching(self, limit: int = 1000) -> Listed:
        return self.store.enqueued(self.task, self.args, self.queue, limit)

    def __str__(self) -> str:
        parts = [f"of task {self.task!r}" if self.task is not None else "of any task"]
        if self.args != "{}":
            parts.append(f"with args including {self.args}")
        parts.append(f"in queue {self.queue!r}" if self.queue is not None else "in any queue")
        seen = " (as the given connection sees it)" if self.store.conn is not None else ""
        return f"{' '.join(parts)}, in schema {self.store.schema}{seen}"


def enqueued(
    app: App | Task[Any, Any],
    task: Task[Any, Any] | str | None = None,
    *,
    args: Mapping[str, Any] | None = None,
    queue: str | None = None,
    conn: Conn | None = None,
) -> list[EnqueuedJob]:
    """The jobs enqueued and waiting (ready: due now, or later), oldest first: of `task`
    (a task or its name; or give the task alone, `enqueued(task)`), in `queue`, whose
    arguments include `args` (every key given, with an equal value; others may be
    there too). `conn`: read on the test's own connection, which sees what it enqueued
    in its open transaction. At most 1,000."""
    return Wanted.of(app, task, args, queue, conn).matching().jobs


def assert_enqueued(
    app: App | Task[Any, Any],
    task: Task[Any, Any] | str | None = None,
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    conn: Conn | None = None,
    timeout: float = 0.0,
) -> EnqueuedJob:
    """Assert that a job as enqueued() selects it is waiting, and return the oldest such
    job; else raise AssertionError listing what is enqueued (those of `task` first).
    `timeout`: wait up to that many seconds for one (enqueued by another thread or
    process), looking every 20 ms."""
    wanted = Wanted.of(app, task, args, queue, conn)
    try:
        jobs: list[EnqueuedJob] = wait_for(
            lambda: wanted.matching(1).jobs, timeout=timeout, what=str(wanted)
        )
    except WaitTimedOut:
        within = f" within {timeout:g} s" if timeout else ""
        raise AssertionError(f"no job enqueued{within} {wanted}; {_present(wanted)}") from None
    return jobs[0]


def refute_enqueued(
    app: App | Task[Any, Any],
    task: Task[Any, Any] | str | None = None,
    args: Mapping[str, Any] | None = None,
    *,
    queue: str | None = None,
    conn: Conn | None = None,
) -> None:
    """Assert that no job as enqueued() selects it is waiting; else raise AssertionError
    listing those that are."""
    wanted = Wanted.of(app, task, args, queue, conn)
    found = wanted.matching(SHOWN)
    if found.total:
        raise AssertionError(
            f"expected no job enqueued {wanted}, found {found.total}:\n{_listed(found)}"
        )


def _present(wanted: Wanted) -> str:
    """What is enqueued, for a failed assertion: a few jobs, those of its task first."""
    found = wanted.store.sample(wanted.task, SHOWN)
    if not found.total:
        return "nothing is enqueued (no job ready or scheduled)"
    first = f", those of task {wanted.task!r} first" if wanted.task is not None else ""
    return f"enqueued are {found.total} job(s){first}:\n{_listed(found)}"


def _listed(found: Listed) -> str:
    lines = [f"  {job}" for job in found.jobs]
    if found.total > len(found.jobs):
        lines.append(f"  ... and {found.total - len(found.jobs)} more")
    return "\n".join(lines)
