"""What one refresh of `forklift top` shows, read from the database in one session, and
the trends (depth, rate) it keeps between refreshes."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from forklift import _db
from forklift._ids import owner_process
from forklift.admin import AdminStore, Connector, JobAdmin, ProcessRow, QueueStats
from forklift.admin.rows import DeadJob, RunningJobRow
from forklift.cli import limits
from forklift.errors import DatabaseError
from forklift.shown import output
from forklift.shown.jobview import progress_json

TREND = 11  # samples a sparkline shows: the last 11 refreshes
FAILURES = 5  # recent dead jobs read


@dataclass(frozen=True)
class Worker:
    """A worker process (registered, or known only as the owner of a running job)."""

    id: str
    host: str
    pid: int
    jobs: list[RunningJobRow]
    rss_bytes: int | None = None
    registered: bool = True


@dataclass(frozen=True)
class Frame:
    at: datetime
    where: str
    queues: list[QueueStats] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    supervisors: int = 0
    failures: list[DeadJob] = field(default_factory=list)
    error: str | None = None  # the last read failed: this is the frame before it


def workers_of(procs: list[ProcessRow], running: list[RunningJobRow]) -> list[Worker]:
    """Every worker with the jobs it runs; a running job's owner not registered yet (the
    registry is written every few seconds) is shown too, from its owner id host:pid:x."""
    by_owner: dict[str, list[RunningJobRow]] = {}
    for job in running:
        by_owner.setdefault(job.owner, []).append(job)
    shown = [
        Worker(p.id, p.host, p.pid, by_owner.pop(p.id, []), p.rss_bytes)
        for p in procs
        if p.kind == "worker"
    ]
    for owner, jobs in by_owner.items():
        host, pid = owner_process(owner)
        shown.append(Worker(owner, host, pid, jobs, None, False))
    return sorted(shown, key=lambda w: (not w.jobs, w.host, w.pid))


class TopReader:
    """Reads a frame each refresh over one connection; a failure keeps the last frame."""

    def __init__(self, dsn: str, schema: str) -> None:
        timeouts = _db.Timeouts(connect=2.0, statement=2.0, lock=1.0)
        self.connector = Connector(dsn, timeouts)
        self.admin = AdminStore(dsn, schema, timeouts, self.connector)
        self.jobs = JobAdmin(dsn, schema, self.connector)
        self.where = f"{_db.describe(dsn)} schema {schema}"
        self.last = Frame(datetime.now(UTC), self.where)

    def read(self) -> Frame:
        now = datetime.now(UTC)
        try:
            with self.connector.session("forklift top: reading failed"):
                procs = self.admin.process_list()
                frame = Frame(
                    now,
                    self.where,
                    self.admin.queue_stats(hour=False),  # top shows the minute only
                    workers_of(procs, self.jobs.job_running_list()),
                    sum(1 for p in procs if p.kind == "supervisor"),
                    self.jobs.job_dead_recent(FAILURES),
                )
        except DatabaseError as exc:
            frame = Frame(
                now, self.where, self.last.queues, self.last.workers, self.last.supervisors,
                self.last.failures, _db.redact(str(exc)),
            )  # fmt: skip
        self.last = frame
        return frame


class Trends:
    """Each queue's recent depth (ready) and rate (done in the last minute), one sample
    per refresh."""

    def __init__(self, length: int = TREND) -> None:
        self.length = length
        self.depth: dict[str, deque[int]] = {}
        self.rate: dict[str, deque[int]] = {}

    def add(self, frame: Frame) -> None:
        if frame.error is not None:
            return  # an old frame again: not a new sample
        for q in frame.queues:
            self.depth.setdefault(q.queue, deque(maxlen=self.length)).append(q.ready)
            self.rate.setdefault(q.queue, deque(maxlen=self.length)).append(q.succeeded_last_minute)


def frame_json(frame: Frame) -> dict[str, Any]:
    """One frame in `top --json`'s documented shape."""
    return {
        "at": output.utc(frame.at),
        "error": frame.error,
        "supervisors": frame.supervisors,
        "queues": [
            {
                "queue": q.queue, "paused": q.paused, "ready": q.ready, "scheduled": q.scheduled,
                "running": q.running, "dead": q.dead,
                "oldest_ready_age_seconds": q.oldest_ready_age,
                "succeeded_last_minute": q.succeeded_last_minute,
                "dead_last_minute": q.dead_last_minute, **limits.stats_json(q),
            }
            for q in frame.queues
        ],
        "workers": [
            {
                "id": w.id, "host": w.host, "pid": w.pid, "registered": w.registered,
                "rss_bytes": w.rss_bytes,
                "jobs": [
                    {"id": j.id, "task": j.task, "queue": j.queue, "attempt": j.attempt,
                     "running_seconds": j.running_for, "progress": progress_json(j.progress),
                     "checkpoint_seconds_ago": j.checkpoint_age}
                    for j in w.jobs
                ],
            }
            for w in frame.workers
        ],
        "recent_failures": [
            {"id": d.id, "queue": d.queue, "task": d.task, "seconds_ago": d.ago, "error": d.error}
            for d in frame.failures
        ],
    }  # fmt: skip
