"""WorkerConfig: the knobs of one worker process, with their defaults."""

from __future__ import annotations

from dataclasses import dataclass

from forklift import _names
from forklift.errors import ConfigError


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker process claims and runs jobs."""

    queues: tuple[str, ...] = ("default",)
    # What this host has that some tasks require (@app.task(requires={"gpu"})): the
    # worker also claims jobs that require labels it has every one of, before others.
    labels: tuple[str, ...] = ()
    # Jobs at once in this process (plain handlers on threads, async ones on its event
    # loop); 1 suits CPU-heavy work (one process per core), more suits I/O-bound or tiny
    # jobs, hundreds async ones. The worker never claims more than it can run.
    concurrency: int = 1
    # Connections for handlers' ctx.transaction() (plus 3 for claims, renewals and
    # completions); None: min(concurrency, 8). A handler waits for a free one.
    pool: int | None = None
    # Seconds one statement of a handler's inside ctx.transaction() may take when its
    # task has no timeout (with one, the task's timeout bounds it instead).
    effect_statement_timeout: float = 300.0
    # Seconds a claim is good for without renewal; renewed every lease / 3.
    lease: float = 30.0
    # Fallback poll when no notification arrives (NOTIFY is only a hint).
    poll_interval: float = 2.0
    listen: bool = True
    # Claim beyond the free slots as far as measured job times say the extra jobs start
    # within a few claim round trips (never a long job; see prefetch.py).
    prefetch: bool = True
    # Seconds a graceful stop waits for running jobs before releasing them.
    grace: float = 30.0
    # Exit cleanly after this many jobs (None: never); the supervisor replaces the process.
    max_jobs: int | None = None
    # Run the rescuer and the retention cleaner from this worker.
    maintenance: bool = True
    maintenance_interval: float = 10.0
    keep_finished: float = 86400.0
    keep_dead: float = 7 * 86400.0
    # A batch still filling this long after its last enqueue is finished as abandoned.
    batch_abandon_after: float = 3600.0

    def __post_init__(self) -> None:
        if not self.queues or any(not q for q in self.queues):
            raise ConfigError("queues must name at least one non-empty queue")
        try:
            object.__setattr__(self, "labels", _names.check_labels(self.labels))
        except ValueError as exc:
            raise ConfigError(f"labels: {exc}") from None
        if len(self.labels) > _names.MAX_LABELS:
            raise ConfigError(
                f"labels: {len(self.labels)} given, at most {_names.MAX_LABELS} (a worker's "
                "claim looks for every set of them)"
            )
        if self.concurrency < 1:
            raise ConfigError("concurrency must be >= 1")
        if self.pool is not None and self.pool < 1:
            raise ConfigError("pool must be >= 1")
        if self.lease < 1:
            raise ConfigError("lease must be >= 1 second")
        if self.effect_statement_timeout <= 0:
            raise ConfigError("effect_statement_timeout must be > 0")
        if self.poll_interval <= 0:
            raise ConfigError("poll_interval must be > 0")
        if self.grace < 0:
            raise ConfigError("grace must be >= 0")
        if self.max_jobs is not None and self.max_jobs < 1:
            raise ConfigError("max_jobs must be >= 1")

    @property
    def pool_size(self) -> int:
        return self.pool if self.pool is not None else min(self.concurrency, 8)
