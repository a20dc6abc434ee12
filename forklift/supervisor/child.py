"""What the parent knows about its children: their jobs, their health, why they go."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from forklift._events import emit
from forklift.shared_tally import SharedTally
from forklift.supervisor.exits import ChildFacts
from forklift.supervisor.reports import (
    Booted,
    Heartbeat,
    JobCancelled,
    JobEnded,
    JobStarted,
    MetricDeltas,
    Report,
    ReportPipe,
)
from forklift.supervisor.running import RunningHandlers
from forklift.supervisor.states import KillReason, RetireReason

log = logging.getLogger(__name__)

# How the parent signals a child: os.kill, or a recorder in the unit tests.
Signaller = Callable[[int, int], None]


def send_signal(pid: int, signum: int) -> None:
    """os.kill, for a child that may already be gone (its exit is reaped later)."""
    try:
        os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


@dataclass
class RunningJob:
    job_id: int
    task: str
    started: float
    timeout: float | None
    cancelled: float | None = None  # when the child said an operator cancelled it
    grace: float = 0.0  # killed this long past its timeout (an async handler's own cancel)

    def overdue(self, now: float) -> bool:
        return self.timeout is not None and now - self.started > self.timeout + self.grace


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
    ran_recently: bool = False  # a job ended since the heartbeat before last
    # Set when the parent asked it to go (scale down, reload, shutdown).
    retiring: RetireReason | None = None
    # Set when the parent is killing it; the next SIGKILL is due at kill_at.
    killing: Kill | None = None
    kill_at: float | None = None
    # Its jobs that overran their timeout, each with why: charged once it is dead.
    timed_out: dict[int, str] = field(default_factory=dict)
    generation: int = 0
    on_metrics: Callable[[dict[str, Any]], None] | None = None
    # Called with the number of malformed reports read (the supervisor's metric).
    on_malformed: Callable[[int], None] | None = None
    malformed: int = 0  # reports from it that could not be read, dropped
    booted: bool = False  # it said its worker loop runs
    reported: bool = False  # it has said anything at all since its fork
    on_close: Callable[[], None] | None = None  # forgets its hint pipes (the spawner's)
    counts: SharedTally | None = None  # its job outcome counters (shared_tally.py)
    # Read from its counters after its exit: a group commit it sent and never heard back
    # from, (id, attempt, key) each, for the database to settle (Reaper).
    unanswered: list[tuple[int, int, tuple[str, str, str]]] = field(default_factory=list)
    handlers: RunningHandlers | None = None  # which of its jobs' handlers run (running.py)
    crash_log: int | None = None  # a memfd its faulthandler writes a native crash's stack to
    # Read after its exit: the jobs whose handlers ran (None: it cannot tell), and the
    # Python stack a native crash left.
    running_at_exit: tuple[int, ...] | None = None
    crash_stack: str = ""

    def __post_init__(self) -> None:
        self._reports = ReportPipe(self.pipe)

    def read(self, now: float) -> bool:
        """Take in the child's reports; return False once its pipe is closed.

        A report that cannot be read (garbage, a torn write) is counted and dropped:
        nothing a child writes raises here.
        """
        decoded, still_open = self._reports.read()
        if decoded.reports or decoded.malformed:
            self.last_seen = now  # any line is a sign of life
            self.reported = True
        bad = list(decoded.malformed)
        for report in decoded.reports:
            if not self.take_report(report, now):
                bad.append(repr(report).encode()[:80])
        if bad:
            self.count_malformed(len(bad), bad[0])
        if decoded.reports:
            self.take_counts()
        return still_open

    def take_counts(self) -> None:
        """Add what its shared counters grew by (as it reports, and after its exit)."""
        if self.counts is None or self.on_metrics is None:
            return
        grown, bad = self.counts.changes()
        if grown:
            self.on_metrics({"jobs": grown})
        if bad:
            self.count_malformed(bad, b"shared counters")

    def count_malformed(self, n: int, sample: bytes) -> None:
        """Count `n` reports dropped as malformed, and say so (one line per read)."""
        self.malformed += n
        if self.on_malformed is not None:
            self.on_malformed(n)
        emit(
            log,
            "child.malformed_report",
            logging.WARNING,
            pid=self.pid,
            count=n,
            total=self.malformed,
            sample=ascii(sample),
        )

    def take_report(self, report: Report, now: float) -> bool:
        """Apply one report; False if its content was unusable (malformed counts)."""
        match report:
            case Heartbeat(rss, ran):
                self.rss = rss
                self.peak_rss = max(self.peak_rss, rss)
                # Jobs too short to be told one by one still make it busy, not idle.
                self.ran_recently = ran > 0
                if ran and not self.jobs:
                    self.idle_since = now
            case Booted():
                self.booted = True
            case JobStarted(job_id, timeout, task, grace):
                self.jobs[job_id] = RunningJob(job_id, task, now, timeout, grace=grace)
                self.idle_since = None
            case JobCancelled(job_id) if job_id in self.jobs:
                self.jobs[job_id].cancelled = self.jobs[job_id].cancelled or now
            case JobEnded(job_id):
                self.jobs.pop(job_id, None)
                # Its next job may have started untold: busy until a beat says it ran none.
                self.ran_recently = True
                if not self.jobs:
                    self.idle_since = now
            case MetricDeltas(deltas) if self.on_metrics is not None:
                try:
                    self.on_metrics(deltas)
                except ValueError:
                    return False  # its counts are lost, not wrong
        return True

    @property
    def busy(self) -> bool:
        return bool(self.jobs) or self.ran_recently

    def facts(self, now: float) -> ChildFacts:
        """What the exit decision needs to know of this child."""
        return ChildFacts(
            retiring=self.retiring,
            killing=self.killing.reason if self.killing else None,
            timeout_charged=bool(self.timed_out),
            held_jobs=bool(self.jobs),
            uptime=now - self.started,
            booted=self.booted,
        )

    def close(self) -> None:
        self._reports.close()
        if self.counts is not None:
            self.take_counts()  # what it counted before it exited, killed or not
            self.unanswered = self.counts.unanswered()
            self.counts.close()
            self.counts = None
        if self.handlers is not None:
            self.running_at_exit = self.handlers.running()
            self.handlers.close()
            self.handlers = None
        if self.crash_log is not None:
            self.crash_stack = read_crash_log(self.crash_log)
            os.close(self.crash_log)
            self.crash_log = None
        if self.on_close is not None:
            self.on_close()
            self.on_close = None


# What of a native crash's stack a job's error keeps: the innermost frames of the thread
# that crashed come first in faulthandler's output, other threads after.
CRASH_STACK_CHARS = 2000


def read_crash_log(fd: int) -> str:
    """What faulthandler wrote there (its first CRASH_STACK_CHARS), as text."""
    try:
        raw = os.pread(fd, CRASH_STACK_CHARS, 0)
    except OSError:
        return ""
    return raw.decode("ascii", "replace").strip()


class Children:
    """The children forked and not yet reaped, by pid, and how the parent signals them.

    Only the supervisor's loop touches it; the ops threads see a snapshot.
    """

    def __init__(self, send: Signaller = send_signal) -> None:
        self._by_pid: dict[int, Child] = {}
        self._send = send

    def __iter__(self) -> Iterator[Child]:
        return iter(list(self._by_pid.values()))  # a copy: steps may add or remove

    def __len__(self) -> int:
        return len(self._by_pid)

    def add(self, child: Child) -> None:
        self._by_pid[child.pid] = child

    def pop(self, pid: int) -> Child | None:
        return self._by_pid.pop(pid, None)

    def live(self) -> list[Child]:
        """The ones that count toward the target: not retiring, not being killed."""
        return [c for c in self._by_pid.values() if not c.retiring and not c.killing]

    def busy(self) -> int:
        return sum(1 for c in self._by_pid.values() if c.busy)

    def free_index(self) -> int:
        """The lowest slot number (1, 2, ...) no live child holds.

        A replacement takes the slot of the child it replaces even while that one is
        still on its way out: `worker 2/2`, never `worker 3/2`.
        """
        return self.free_slots(len(self.live()) + 1)[0]

    def free_slots(self, up_to: int) -> list[int]:
        """The slot numbers from 1 to `up_to` that no live child holds, lowest first."""
        used = {c.index for c in self.live()}
        return [i for i in range(1, up_to + 1) if i not in used]

    def pipes(self) -> list[int]:
        return [c.pipe for c in self._by_pid.values()]

    def signal(self, child: Child, signum: int) -> None:
        self._send(child.pid, signum)

    def signal_group(self, child: Child, signum: int) -> None:
        """Signal what is left of a child's process group (forkserver.own_process_group): the
        subprocesses its handlers started. Once the child is dead, its group's id cannot
        be taken by another process while any member lives."""
        self._send(-child.pid, signum)

    def retire(self, child: Child, why: RetireReason) -> None:
        """Ask a child to finish its jobs and exit (no attribution: it is not failing)."""
        child.retiring = why
        self.signal(child, signal.SIGTERM)
        emit(log, "child.retiring", pid=child.pid, reason=why)
