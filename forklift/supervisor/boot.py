"""A child's life after fork: fresh state, its own connections, the worker loop, exit."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from types import FrameType

from setproctitle import setproctitle

from forklift.app import App
from forklift.metrics import Tally
from forklift.store import ClaimedJob
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.reports import Reporter
from forklift.workers.worker import Worker

log = logging.getLogger(__name__)

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_of(pid: int | str = "self") -> int:
    """Resident set size in bytes, from /proc (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class ChildTitle:
    """`forklift worker 2/4 [default]: idle` / `...: running render#123`."""

    def __init__(self, index: int, total: int, queues: tuple[str, ...]) -> None:
        self.prefix = f"forklift worker {index}/{total} [{','.join(queues)}]"
        self.running: dict[int, str] = {}
        self.lock = threading.Lock()

    def update(self) -> None:
        with self.lock:
            jobs = list(self.running.items())
        if not jobs:
            setproctitle(f"{self.prefix}: idle")
        elif len(jobs) == 1:
            job_id, task = jobs[0]
            setproctitle(f"{self.prefix}: running {task}#{job_id}")
        else:
            setproctitle(f"{self.prefix}: running {len(jobs)} jobs")


@dataclass(frozen=True)
class ChildSpec:
    """Who a forked child is: its slot, its lease owner id, its pipe, its parent."""

    index: int
    total: int
    owner: str
    report_fd: int
    parent_pid: int


def child_main(app: App, config: SupervisorConfig, spec: ChildSpec) -> None:
    """Run in the forked child; never returns (os._exit keeps the parent's atexit away)."""
    code = 0
    try:
        code = _run(app, config, spec)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def _run(app: App, config: SupervisorConfig, spec: ChildSpec) -> int:
    index, owner, parent_pid = spec.index, spec.owner, spec.parent_pid
    # One child per supervisor runs the rescuer and the retention cleaner; both are
    # safe to run concurrently across replicas (SKIP LOCKED, bounded batches).
    worker_config = replace(config.worker, maintenance=config.worker.maintenance and index == 1)
    if config.max_jobs_per_child is not None:
        worker_config = replace(worker_config, max_jobs=config.max_jobs_per_child)
    title = ChildTitle(index, spec.total, worker_config.queues)
    report = Reporter(spec.report_fd)
    tally = Tally()

    def started(job: ClaimedJob) -> None:
        # The worker's own task definition decides the timeout; the row's copy (the
        # producer's view) covers tasks this worker does not define.
        task = app.tasks.get(job.task)
        timeout = task.timeout if task is not None and task.timeout else job.timeout
        report.start(job.id, timeout, job.task)
        with title.lock:
            title.running[job.id] = job.task
        title.update()

    def ended(job: ClaimedJob, outcome: str) -> None:
        report.end(job.id)
        with title.lock:
            title.running.pop(job.id, None)
        title.update()

    worker = Worker(
        app, worker_config, owner=owner, on_job_start=started, on_job_end=ended, tally=tally
    )

    def on_term(signum: int, frame: FrameType | None) -> None:
        worker.request_stop(fast=signum == signal.SIGQUIT)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGQUIT, on_term)
    # Ctrl-C reaches the whole process group; the parent decides what the children do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)

    closing = threading.Event()
    soft_limit = int(config.max_memory_per_child * 2**20) if config.max_memory_per_child else None

    def heartbeat() -> None:
        while not closing.wait(0.5):
            rss = rss_of()
            delta = tally.take()
            if delta is not None:
                report.metrics(delta)
            report.heartbeat(rss)
            if os.getppid() != parent_pid:
                log.error("supervisor %s is gone; stopping", parent_pid)
                worker.request_stop()
            if soft_limit is not None and rss > soft_limit and not worker.stopping:
                log.warning(
                    "worker %s: RSS %.0f MiB past the %.0f MiB limit; recycling after its job",
                    owner,
                    rss / 2**20,
                    soft_limit / 2**20,
                )
                worker.request_stop()

    title.update()
    beat = threading.Thread(target=heartbeat, name="forklift-parent-heartbeat", daemon=True)
    beat.start()
    try:
        worker.run()
    finally:
        closing.set()
        delta = tally.take()  # the last counts go out before the exit
        if delta is not None:
            report.metrics(delta)
    return 0
