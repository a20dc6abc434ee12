"""Job metrics: counted in each worker process, summed by the supervisor, exposed once.

A worker keeps its `Tally` of what it counted since its last report, and hands the
supervisor the deltas every half second over its report pipe; a supervisor's child
counts its job outcomes in a `SharedTally` (shared_tally.py) that its supervisor reads
itself. The supervisor adds both into its `Totals`, never reset, so a child's crash or
recycling never makes a counter go down and nothing is written to disk. `Totals` is
exposed through a prometheus-client collector (supervisor/exposition.py: a worker never
imports prometheus_client).

Its task label is bounded: a task the app does not declare is counted as
task="(unknown)", and past MAX_TASK_LABELS distinct names further ones as
task="(other)" (a job's task name is whatever a producer wrote; series are never pruned).
"""

from __future__ import annotations

import bisect
import math
import threading
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from forklift.shared_tally import SharedTally

DURATION_BUCKETS = (
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
)
WAIT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.05,
    0.1,
    0.5,
    1.0,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    1800.0,
    3600.0,
)

# Seconds from a batch's last job's end to its callback's enqueue.
CALLBACK_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 5.0, 30.0)
BATCH_OUTCOMES = ("succeeded", "failed", "cancelled", "abandoned")

MAX_TASK_LABELS = 200  # distinct task label values; the rest are counted as OTHER_TASK
UNKNOWN_TASK = "(unknown)"  # a task the app does not declare (no task name has parentheses
OTHER_TASK = "(other)"  # around it by convention; a collision would only merge two counts)

OUTCOMES = ("succeeded", "failed", "dead", "released", "lease_lost", "cancelled", "crashed")


def _count(value: Any) -> int:
    """A count from a child's report: a whole number >= 0 (ValueError otherwise)."""
    n = int(value)
    if n < 0 or n != value:
        raise ValueError(f"{value!r} is not a count")
    return n


def _seconds(value: Any) -> float:
    """Seconds from a child's report: a finite number >= 0 (ValueError otherwise)."""
    seconds = float(value)
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"{value!r} is not a number of seconds")
    return seconds


@dataclass
class Histo:
    """Bucket counts (non-cumulative, one slot per bound plus +Inf), sum and count."""

    counts: list[int]
    total: float = 0.0

    @classmethod
    def empty(cls, bounds: tuple[float, ...]) -> Histo:
        return cls([0] * (len(bounds) + 1))

    def observe(self, bounds: tuple[float, ...], value: float) -> None:
        self.counts[bisect.bisect_left(bounds, value)] += 1
        self.total += value

    @classmethod
    def load(cls, dumped: list[Any], bounds: tuple[float, ...]) -> Histo:
        """The histogram `dump()` made (ValueError or TypeError if it is not one)."""
        counts, total = dumped
        loaded = [_count(n) for n in counts[: len(bounds) + 1]]
        total = float(total)
        if not math.isfinite(total):
            raise ValueError("a histogram's sum must be finite")
        return cls(loaded + [0] * (len(bounds) + 1 - len(loaded)), total)

    def add(self, other: Histo) -> None:
        for i, n in enumerate(other.counts):
            self.counts[i] += n
        self.total += other.total

    def dump(self) -> list[Any]:
        return [self.counts, self.total]


@dataclass
class Tally:
    """What one worker process counted since its last report (thread-safe)."""

    jobs: dict[tuple[str, str, str], int] = field(default_factory=dict)
    durations: dict[tuple[str, str], Histo] = field(default_factory=dict)
    waits: dict[str, Histo] = field(default_factory=dict)
    renewals: int = 0
    batches: dict[str, int] = field(default_factory=dict)
    callback_delays: Histo = field(default_factory=lambda: Histo.empty(CALLBACK_BUCKETS))
    # Attempts that resumed from a checkpoint, and the seconds of work it stood for.
    resumes: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    # A supervisor's child counts outcomes here, in memory its supervisor reads (and
    # reads once more after a kill); what does not fit goes by `jobs` and the pipe.
    shared: SharedTally | None = None

    def job(self, queue: str, task: str, outcome: str, duration: float | None) -> None:
        with self.lock:
            self._job(queue, task, outcome, duration)

    def intend(self, jobs: list[tuple[int, int, str, str]]) -> None:
        """A group commit of these (id, attempt, queue, task) is about to be sent."""
        if self.shared is not None:
            with self.lock:
                self.shared.intend([(i, a, (q, t, "succeeded")) for i, a, q, t in jobs])

    def jobs_succeeded(self, done: list[tuple[str, str, float]], *, intended: bool = True) -> None:
        """Many successes (queue, task, duration), counted under one hold of the lock;
        a group commit's, folded into its intent (SharedTally.fold) when it has one and
        they are `intended` (False: successes no intent stands for)."""
        with self.lock:
            if intended and self.shared is not None and self.shared.intended:
                self.shared.fold(Counter((q, t, "succeeded") for q, t, _ in done))
                for queue, task, duration in done:
                    self._duration(queue, task, duration)
                return
            for queue, task, duration in done:
                self._job(queue, task, "succeeded", duration)

    def _job(self, queue: str, task: str, outcome: str, duration: float | None) -> None:
        key = (queue, task, outcome)
        if self.shared is None or not self.shared.add(key):
            self.jobs[key] = self.jobs.get(key, 0) + 1
        if duration is not None:
            self._duration(queue, task, duration)

    def _duration(self, queue: str, task: str, duration: float) -> None:
        h = self.durations.get((queue, task))
        if h is None:
            h = self.durations[(queue, task)] = Histo.empty(DURATION_BUCKETS)
        h.observe(DURATION_BUCKETS, duration)

    def wait(self, queue: str, seconds: float) -> None:
        with self.lock:
            h = self.waits.get(queue)
            if h is None:
                h = self.waits[queue] = Histo.empty(WAIT_BUCKETS)
            h.observe(WAIT_BUCKETS, seconds)

    def renewed(self, n: int) -> None:
        with self.lock:
            self.renewals += n

    def batch(self, outcome: str, callback_delay: float) -> None:
        """A batch this process finished: its outcome, and how long after its last job."""
        with self.lock:
            self.batches[outcome] = self.batches.get(outcome, 0) + 1
            self.callback_delays.observe(CALLBACK_BUCKETS, callback_delay)

    def resumed(self, queue: str, task: str, saved: float) -> None:
        """An attempt resumed from a checkpoint standing for `saved` seconds of work."""
        with self.lock:
            n, seconds = self.resumes.get((queue, task), (0, 0.0))
            self.resumes[queue, task] = (n + 1, seconds + max(0.0, saved))

    def take(self) -> dict[str, Any] | None:
        """The deltas since the last take() (None if nothing happened), and reset.

        JSON-ready, for the report pipe: {"jobs": [[queue, task, outcome, n], ...],
        "durations": [[queue, task, histogram], ...], "waits": [[queue, histogram], ...],
        "renewals": n, "batches": [[outcome, n], ...], "callback_delays": histogram},
        a histogram being [bucket counts, sum].
        """
        with self.lock:
            if not (
                self.jobs
                or self.durations
                or self.waits
                or self.renewals
                or self.batches
                or self.resumes
            ):
                return None
            delta: dict[str, Any] = {
                "jobs": [[q, t, o, n] for (q, t, o), n in self.jobs.items()],
                "durations": [[q, t, h.dump()] for (q, t), h in self.durations.items()],
                "waits": [[q, h.dump()] for q, h in self.waits.items()],
                "renewals": self.renewals,
            }
            if self.batches:
                delta["batches"] = [[o, n] for o, n in self.batches.items()]
                delta["callback_delays"] = self.callback_delays.dump()
            if self.resumes:
                delta["resumes"] = [[q, t, n, s] for (q, t), (n, s) in self.resumes.items()]
            self.jobs, self.durations, self.waits, self.renewals = {}, {}, {}, 0
            self.resumes = {}
            self.batches, self.callback_delays = {}, Histo.empty(CALLBACK_BUCKETS)
            return delta


class TaskLabels:
    """The task label a name is counted under: itself while it is declared (or nothing
    is declared) and fewer than `limit` names have labels, else UNKNOWN_TASK or OTHER_TASK."""

    def __init__(self, declared: Iterable[str] | None = None, limit: int = MAX_TASK_LABELS):
        self.declared = None if declared is None else set(declared)
        self.limit = limit
        self.given: set[str] = set()

    def declare(self, names: Iterable[str]) -> None:
        """More declared names (a reloaded app's); the old ones stay declared."""
        if self.declared is not None:
            self.declared.update(names)

    def __call__(self, task: str) -> str:
        if task in self.given:
            return task
        if self.declared is not None and task not in self.declared:
            return UNKNOWN_TASK
        if len(self.given) >= self.limit:
            return OTHER_TASK
        self.given.add(task)
        return task


class Totals:
    """The supervisor's running sums of every child's deltas (never reset), with a
    bounded set of task labels (see TaskLabels)."""

    def __init__(
        self, tasks: Iterable[str] | None = None, max_task_labels: int = MAX_TASK_LABELS
    ) -> None:
        self.lock = threading.Lock()
        self.task_label = TaskLabels(tasks, max_task_labels)
        self.jobs: dict[tuple[str, str, str], int] = {}
        self.durations: dict[tuple[str, str], Histo] = {}
        self.waits: dict[str, Histo] = {}
        self.renewals = 0
        self.restarts: dict[str, int] = {}
        self.malformed_reports = 0
        self.batches: dict[str, int] = {}
        self.callback_delays = Histo.empty(CALLBACK_BUCKETS)
        self.resumes: dict[tuple[str, str], tuple[int, float]] = {}

    def add(self, delta: dict[str, Any]) -> None:
        """Add one child's `Tally.take()` deltas; a malformed one adds nothing and raises
        ValueError, whatever is wrong with it (it came through a pipe from a child)."""
        try:
            jobs = [((str(q), str(t), str(o)), _count(n)) for q, t, o, n in delta.get("jobs", ())]
            durations = [
                ((str(q), str(t)), Histo.load(h, DURATION_BUCKETS))
                for q, t, h in delta.get("durations", ())
            ]
            waits = [(str(q), Histo.load(h, WAIT_BUCKETS)) for q, h in delta.get("waits", ())]
            renewals = _count(delta.get("renewals", 0))
            batches = [(str(o), _count(n)) for o, n in delta.get("batches", ())]
            if any(o not in BATCH_OUTCOMES for o, _ in batches):
                raise ValueError("unknown batch outcome")
            delays = delta.get("callback_delays")
            callback_delays = None if delays is None else Histo.load(delays, CALLBACK_BUCKETS)
            resumes = [
                ((str(q), str(t)), _count(n), _seconds(sec))
                for q, t, n, sec in delta.get("resumes", ())
            ]
        except (TypeError, ValueError, ArithmeticError, AttributeError) as exc:
            raise ValueError(f"malformed metric deltas: {type(exc).__name__}: {exc}") from None
        with self.lock:
            for (queue, task, outcome), n in jobs:
                key = (queue, self.task_label(task), outcome)
                self.jobs[key] = self.jobs.get(key, 0) + n
            for (queue, task), h in durations:
                pair = (queue, self.task_label(task))
                self.durations.setdefault(pair, Histo.empty(DURATION_BUCKETS)).add(h)
            for queue, h in waits:
                self.waits.setdefault(queue, Histo.empty(WAIT_BUCKETS)).add(h)
            self.renewals += renewals
            for outcome, n in batches:
                self.batches[outcome] = self.batches.get(outcome, 0) + n
            if callback_delays is not None:
                self.callback_delays.add(callback_delays)
            for (queue, task), n, seconds in resumes:
                pair = (queue, self.task_label(task))
                had, saved = self.resumes.get(pair, (0, 0.0))
                self.resumes[pair] = (had + n, saved + seconds)

    def malformed(self, n: int) -> None:
        """Count reports from children that could not be read."""
        with self.lock:
            self.malformed_reports += n

    def declare(self, tasks: Iterable[str]) -> None:
        """Tasks a reloaded app declares, counted under their own names from now on."""
        with self.lock:
            self.task_label.declare(tasks)

    def job(self, queue: str, task: str, outcome: str) -> None:
        with self.lock:
            key = (queue, self.task_label(task), outcome)
            self.jobs[key] = self.jobs.get(key, 0) + 1

    def restart(self, reason: str) -> None:
        with self.lock:
            self.restarts[reason] = self.restarts.get(reason, 0) + 1

    def batch(self, outcome: str, callback_delay: float) -> None:
        """A batch the supervisor's own sweep finished."""
        with self.lock:
            self.batches[outcome] = self.batches.get(outcome, 0) + 1
            self.callback_delays.observe(CALLBACK_BUCKETS, callback_delay)
