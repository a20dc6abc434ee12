"""How the processes read: each registered one with the jobs it runs, and the workers
known only as the owners of running jobs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from forklift._ids import owner_process

if TYPE_CHECKING:
    from forklift.admin import ProcessRow
    from forklift.admin.rows import RunningJobRow


@dataclass(frozen=True)
class Listed:
    """One line of `ps`: a registered process, or a worker known only as the owner of
    jobs it runs (its registry row not written yet, or gone while its lease lasts)."""

    id: str
    host: str
    pid: int
    jobs: list[RunningJobRow]
    process: ProcessRow | None


def listed(procs: list[ProcessRow], running: list[RunningJobRow]) -> list[Listed]:
    """Every process with the jobs it runs now, read from the jobs (as `top` reads them),
    not from the registry's heartbeat, which is seconds behind; unregistered owners last."""
    by_owner: dict[str, list[RunningJobRow]] = {}
    for job in running:
        by_owner.setdefault(job.owner, []).append(job)
    shown = [Listed(p.id, p.host, p.pid, by_owner.pop(p.id, []), p) for p in procs]
    for owner, jobs in sorted(by_owner.items()):
        shown.append(Listed(owner, *owner_process(owner), jobs, None))
    return shown
