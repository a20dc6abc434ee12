"""A child's life after fork: fresh state, its own connections, the worker loop, exit."""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import traceback
from dataclasses import dataclass, replace
from types import FrameType
from typing import NoReturn

from forklift.app import App
from forklift.metrics import Tally
from forklift.shared_tally import SharedTally
from forklift.shared_vouch import SharedVouch
from forklift.store import ClaimedJob
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.reports import Reporter
from forklift.supervisor.rss import rss_of
from forklift.supervisor.running import RunningHandlers
from forklift.supervisor.title import ChildTitle
from forklift.workers.config import WorkerConfig
from forklift.workers.wakeup import Wakeup
from forklift.workers.worker import Worker, task_timeout

log = logging.getLogger(__name__)

REPORT_EVERY = 0.5  # the parent's child_timeout must stay well above this

# Seconds past an async job's timeout before its supervisor kills the process for it:
# time for the worker's own cancel of the coroutine (workers/aio.py) and the record of
# its TimeoutError to land first.
ASYNC_TIMEOUT_GRACE = 2.0


@dataclass(frozen=True)
class ChildSpec:
    """Who a forked child is: its slot, its lease owner id, its pipe, its parent."""

    index: int
    total: int
    owner: str
    report_fd: int
    parent_pid: int
    hint_fd: int | None = None  # the parent's session thread's orders (LISTEN, forwarded)
    counts: SharedTally | None = None  # its job outcome counters, shared with the parent
    # Its claim loop's self-pipe (read, write), whose write end the parent's session
    # thread has too: a new job's NEWS (session.HintFanout).
    wake_fds: tuple[int, int] | None = None
    handlers: RunningHandlers | None = None  # which of its jobs' handlers run, shared
    crash_log: int | None = None  # where faulthandler writes a native crash's stack
    # Whether its supervisor's liveness lock is held now: it claims only while it is.
    vouch: SharedVouch | None = None


def child_main(app: App, config: SupervisorConfig, spec: ChildSpec) -> NoReturn:
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
    worker_config = _worker_config(config, spec.index)
    title = ChildTitle(spec.index, spec.total, worker_config.queues)
    report = Reporter(spec.report_fd)
    tally = Tally(shared=spec.counts)
    if spec.crash_log is not None:
        # A native crash (SIGSEGV, SIGABRT, ...) writes every thread's Python stack there;
        # the supervisor puts it on the job that was running.
        faulthandler.enable(file=spec.crash_log, all_threads=True)
    hooks = JobHooks(app, report, title, spec.handlers)
    worker = Worker(
        app,
        worker_config,
        owner=spec.owner,
        on_job_start=hooks.started,
        on_job_end=hooks.ended,
        on_handler=hooks.handler,
        on_booted=report.booted,
        tally=tally,
        on_job_cancel=hooks.cancelled,
        hints_fd=spec.hint_fd,
        wakeup=Wakeup(spec.wake_fds) if spec.wake_fds is not None else None,
        on_waiting=title.waiting,
        vouch=spec.vouch,
    )
    _handle_signals(worker)
    soft_limit = int(config.max_memory_per_child * 2**20) if config.max_memory_per_child else None
    beat = ParentHeartbeat(worker, report, tally, spec, soft_limit, hooks)
    title.update()
    beat.start()
    try:
        worker.run()
    finally:
        beat.stop()
    return 0


def _worker_config(config: SupervisorConfig, index: int) -> WorkerConfig:
    # The supervisor maintains (on its database thread, one replica at a time); a child
    # claims, renews and completes, on one connection.
    worker_config = replace(config.worker, maintenance=False)
    if config.max_jobs_per_child is not None:
        worker_config = replace(worker_config, max_jobs=config.max_jobs_per_child)
    return worker_config


def _handle_signals(worker: Worker) -> None:
    def on_term(signum: int, frame: FrameType | None) -> None:
        worker.request_stop(fast=signum == signal.SIGQUIT)

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGQUIT, on_term)
    # Ctrl-C reaches the whole process group; the parent decides what the children do.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGHUP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, signal.SIG_IGN)


class JobHooks:
    """The worker's job start, cancel and end, told to the parent and shown in the title.

    A handler's call is shown in the title from the moment a death is charged to it
    (`ps` names the job a wedged worker is stuck in). A job with a timeout is told to
    the parent as it starts: the parent enforces it. One without is told only if it is
    still running at the next heartbeat (`flush`), half a second at most later, and its
    end then shows at that beat: so thousands of tiny jobs a second cost no report and
    no work in the parent, which sees only that the child was busy (`ran` in the beat).
    """

    def __init__(
        self,
        app: App,
        report: Reporter,
        title: ChildTitle,
        handlers: RunningHandlers | None = None,
    ) -> None:
        self.app = app
        self.report = report
        self.title = title
        self.handlers = handlers  # marked as each handler begins and returns
        self._lock = threading.Lock()
        self._unreported: dict[int, str] = {}  # started, not told yet: job id -> task
        self._calling: dict[int, str] = {}  # started, its handler not called yet: -> task
        self.ran = 0  # jobs ended since the last heartbeat

    def started(self, job: ClaimedJob) -> None:
        timeout = task_timeout(self.app, job)
        with self._lock:  # one take of the lock per job, on the path of every start
            self._calling[job.id] = job.task
            if timeout is None:
                self._unreported[job.id] = job.task
        if timeout is None:
            return
        task = self.app.tasks.get(job.task)
        # An async handler is cancelled at its timeout by the child itself; the kill (of
        # every job in this process) is only for a loop too blocked to cancel it.
        grace = ASYNC_TIMEOUT_GRACE if task is not None and task.is_async else 0.0
        self.report.start(job.id, timeout, job.task, grace)

    def handler(self, job_id: int, running: bool) -> None:
        """Its handler's call begins (a death of this process from now on may be its
        doing) or has ended, returned or raised (its outcome may still wait for its
        write, but a death is no longer its doing). The title shows the call once it is
        marked: a job `ps` names is one a death is charged to."""
        with self._lock:
            if self.handlers is not None:
                if running:
                    self.handlers.began(job_id)
                else:
                    self.handlers.returned(job_id)
            task = self._calling.pop(job_id, None) if running else None
        if task is not None:
            self.title.started(job_id, task)
        elif not running:
            # Off the title at once (a system call of under a microsecond): a kill from
            # now on is no longer charged to it, and `ps` must not say it is.
            self.title.ended(job_id)

    def flush(self) -> int:
        """Tell the parent of the jobs still running since before this beat, and show
        the ends since; the number of jobs that ended since the last beat."""
        with self._lock:
            running, self._unreported = self._unreported, {}
            ran, self.ran = self.ran, 0
        for job_id, task in running.items():
            self.report.start(job_id, None, task)
        self.title.update()  # the count of jobs running, when it changed
        return ran

    def cancelled(self, job: ClaimedJob) -> None:
        with self._lock:
            task = self._unreported.pop(job.id, None)
        if task is not None:  # the parent must know it runs, to time its cancel grace
            self.report.start(job.id, None, task)
        self.report.cancelled(job.id)

    def ended(self, job: ClaimedJob, outcome: str) -> None:
        with self._lock:
            self.ran += 1
            untold = self._unreported.pop(job.id, None) is not None
            self._calling.pop(job.id, None)  # its handler was never called (refused)
        # Started and ended between two beats: nothing to take back; the beat shows it.
        self.title.ended(job.id, show=not untold)
        if not untold:
            self.report.end(job.id)


class ParentHeartbeat:
    """A thread that reports to the parent every half second: RSS, metric deltas.

    It also stops the worker: at once, its jobs released, when the parent is gone
    (getppid() changed); after its job when the child's RSS passed the soft memory limit
    (it exits and is replaced).
    """

    def __init__(
        self,
        worker: Worker,
        report: Reporter,
        tally: Tally,
        spec: ChildSpec,
        soft_limit: int | None,
        hooks: JobHooks,
    ) -> None:
        self.hooks = hooks
        self.worker = worker
        self.report = report
        self.tally = tally
        self.spec = spec
        self.soft_limit = soft_limit
        self._closing = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="forklift-parent-heartbeat", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._closing.set()
        self._send_metrics()  # the last counts go out before the exit

    def _run(self) -> None:
        while not self._closing.wait(REPORT_EVERY):
            rss = rss_of()
            self._send_metrics()
            self.report.heartbeat(rss, self.hooks.flush())
            if os.getppid() != self.spec.parent_pid:
                # Its supervisor's liveness lock vouched for it: with the supervisor gone,
                # peers charge its jobs within seconds. Give them back now (fast stop).
                log.error("supervisor %s is gone; releasing and stopping", self.spec.parent_pid)
                self.worker.request_stop(fast=True)
            if self.soft_limit is not None and rss > self.soft_limit and not self.worker.stopping:
                log.warning(
                    "worker %s: RSS %.0f MiB past the %.0f MiB limit; recycling after its job",
                    self.spec.owner,
                    rss / 2**20,
                    self.soft_limit / 2**20,
                )
                self.worker.request_stop()

    def _send_metrics(self) -> None:
        deltas = self.tally.take()
        if deltas is not None:
            self.report.metrics(deltas)
