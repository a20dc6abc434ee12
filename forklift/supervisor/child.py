"""What the parent knows about one child: its jobs, its health, why it is going."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forklift.supervisor.exits import ChildFacts
from forklift.supervisor.reports import (
    Heartbeat,
    JobEnded,
    JobStarted,
    MetricDeltas,
    Report,
    ReportPipe,
    parse_report,
)
from forklift.supervisor.states import KillReason, RetireReason


@dataclass
class RunningJob:
    job_id: int
    task: str
    started: float
    timeout: float | None

    def overdue(self, now: float) -> bool:
        return self.timeout is not None and now - self.started > self.timeout


@dataclass(frozen=True)
class Kill:
    """Why the supervisor is killing a child, and the cause its jobs will carry."""

    reason: KillReason
    cause: str


@dataclass
class Child:
    """A forked worker process as the parent tracks it."""

    pid: int
    index: int
    owner: str
    pipe: int
    started: float
    last_seen: float
    rss: int = 0
    peak_rss: int = 0
    jobs: dict[int, RunningJob] = field(default_factory=dict)
    idle_since: float | None = None
    # Set when the parent asked it to go (scale down, reload, shutdown).
    retiring: RetireReason | None = None
    # Set when the parent is killing it; the next SIGKILL is due at kill_at.
    killing: Kill | None = None
    kill_at: float | None = None
    timed_out: list[int] = field(default_factory=list)  # jobs charged for their timeout
    generation: int = 0
    on_metrics: Callable[[dict[str, Any]], None] | None = None

    def __post_init__(self) -> None:
        self._reports = ReportPipe(self.pipe)

    def read(self, now: float) -> bool:
        """Take in the child's reports; return False once its pipe is closed."""
        lines, still_open = self._reports.read()
        for line in lines:
            self.last_seen = now  # any line is a sign of life
            report = parse_report(line)
            if report is not None:
                self.take_report(report, now)
        return still_open

    def take_report(self, report: Report, now: float) -> None:
        match report:
            case Heartbeat(rss):
                self.rss = rss
                self.peak_rss = max(self.peak_rss, rss)
            case JobStarted(job_id, timeout, task):
                self.jobs[job_id] = RunningJob(job_id, task, now, timeout)
                self.idle_since = None
            case JobEnded(job_id):
                self.jobs.pop(job_id, None)
                if not self.jobs:
                    self.idle_since = now
            case MetricDeltas(deltas) if self.on_metrics is not None:
                try:
                    self.on_metrics(deltas)
                except (ValueError, TypeError, KeyError):
                    pass  # a malformed report: its counts are lost, not wrong

    @property
    def busy(self) -> bool:
        return bool(self.jobs)

    def facts(self, now: float) -> ChildFacts:
        """What the exit decision needs to know of this child."""
        return ChildFacts(
            retiring=self.retiring,
            killing=self.killing.reason if self.killing else None,
            timeout_charged=bool(self.timed_out),
            held_jobs=bool(self.jobs),
            uptime=now - self.started,
        )

    def close(self) -> None:
        self._reports.close()
