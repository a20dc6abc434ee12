"""The supervisor: fork children, reap them, attribute their deaths, keep their number.

The main loop is a short list of named steps (wait, read reports, dispatch signals,
reap, police, scale, keep the count); signal handlers only queue. Each step is a
method a test can call.
"""

from __future__ import annotations

import gc
import logging
import os
import secrets
import select
import signal
import socket
import time
from collections.abc import Callable

from setproctitle import setproctitle

from forklift import _db
from forklift._events import emit
from forklift._ids import make_owner
from forklift.app import App
from forklift.errors import DatabaseError
from forklift.metrics import Totals
from forklift.supervisor.autoscale import Autoscaler
from forklift.supervisor.boot import ChildSpec, child_main
from forklift.supervisor.child import Child, Kill
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.death import signal_name
from forklift.supervisor.exits import ExitStatus, RestartCount, Verdict, decide
from forklift.supervisor.ops import Ops
from forklift.supervisor.restarts import RestartPolicy
from forklift.supervisor.rss import rss_of
from forklift.supervisor.signals import SignalQueue
from forklift.supervisor.states import JobsAction, KillReason, RetireReason, StopMode
from forklift.supervisor.store import ProcessInfo, SupervisorStore
from forklift.supervisor.systemd import Notifier

log = logging.getLogger(__name__)

TICK = 0.25
AUTOSCALE_EVERY = 2.0


class Supervisor:
    """The parent process. __init__ does no I/O; run() blocks until stopped, returns 0."""

    def __init__(
        self,
        app: App,
        config: SupervisorConfig | None = None,
        *,
        app_target: str | None = None,
        reimport: Callable[[str], App] | None = None,
    ) -> None:
        self.app = app
        self.config = config or SupervisorConfig()
        self.app_target = app_target
        self._reimport = reimport
        self.children: dict[int, Child] = {}
        self.signals = SignalQueue()
        self.restarts = RestartPolicy()
        low_high = self.config.autoscale
        idle = self.config.autoscale_idle
        self.autoscaler = (
            Autoscaler(*low_high, idle_for=idle, down_cooldown=min(10.0, idle))
            if low_high
            else None
        )
        self.target = low_high[0] if low_high else self.config.workers
        self.generation = 0
        self.stopping: StopMode | None = None
        self.deadline: float | None = None
        self.restart_at = 0.0
        self.crash_loop = False
        self.pending: list[tuple[str, str, JobsAction]] = []  # (owner, error, action)
        self._pending_at = 0.0
        self._pending_delay = 1.0
        self.last_tick = time.monotonic()
        self._next_autoscale = 0.0
        timeouts = _db.Timeouts.for_lease(self.config.worker.lease)
        self.store = SupervisorStore(app.dsn, app.schema, timeouts)
        self.totals = Totals()
        self.ops = Ops(self, self.totals, self.config.metrics_addr)
        self.notifier = Notifier()
        self.id = ""
        self.host = socket.gethostname()
        self.started = time.monotonic()
        self._told_ready = False

    # -- state others read (health endpoints, the ops thread, tests) --------------------

    @property
    def ready(self) -> bool:
        return self.stopping is None and not self.crash_loop and self._live_count() > 0

    @property
    def live_workers(self) -> int:
        return self._live_count()

    def worker_states(self) -> tuple[int, int]:
        """(busy, idle) worker processes."""
        children = list(self.children.values())
        busy = sum(1 for c in children if c.busy)
        return busy, len(children) - busy

    def registry_rows(self) -> list[ProcessInfo]:
        """This supervisor and its workers, as the process registry should show them."""
        now = time.monotonic()
        queues = ",".join(self.config.worker.queues)
        rows = [
            ProcessInfo(
                self.id,
                "supervisor",
                self.host,
                os.getpid(),
                None,
                queues,
                None,
                rss_of(os.getpid()),
                now - self.started,
            )
        ]
        for c in list(self.children.values()):
            current = next(iter(c.jobs), None)
            rows.append(
                ProcessInfo(
                    c.owner,
                    "worker",
                    self.host,
                    c.pid,
                    self.id,
                    queues,
                    current,
                    c.rss or None,
                    now - c.started,
                )
            )
        return rows

    def _live(self) -> list[Child]:
        return [c for c in self.children.values() if not c.retiring and not c.killing]

    def _live_count(self) -> int:
        return len(self._live())

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> int:
        self.id = make_owner(os.getpid())
        self.started = time.monotonic()
        self.signals.install()
        self.ops.start()
        gc.collect()
        gc.freeze()  # preloaded objects stay on shared copy-on-write pages in children
        emit(
            log,
            "supervisor.started",
            pid=os.getpid(),
            workers=self.target,
            queues=",".join(self.config.worker.queues),
        )
        try:
            self._loop()
        finally:
            self.ops.stop()
        emit(log, "supervisor.stopped", pid=os.getpid())
        return 0

    def _loop(self) -> None:
        while True:
            self.last_tick = time.monotonic()
            self.notifier.tick(self.last_tick)
            self.maintain_count()
            self.tell_systemd()
            self.update_title()
            self.wait()
            self.read_reports()
            self.dispatch_signals()
            self.reap()
            if self.stopping and not self.children:
                return
            self.retry_pending()
            self.enforce_timeouts()
            self.enforce_memory()
            self.kill_unresponsive()
            self.escalate_kills()
            self.enforce_deadline()
            self.roll_reload()
            self.autoscale()

    def tell_systemd(self) -> None:
        """READY=1 once the first full set of workers is up (Type=notify units)."""
        if not self._told_ready and self._live_count() >= self.target:
            self._told_ready = True
            self.notifier.ready(f"{self.target} workers")

    def wait(self) -> None:
        """Sleep until a signal, a child report, or the next tick."""
        fds = [self.signals.read_fd] + [c.pipe for c in self.children.values()]
        timeout = TICK
        if self.restart_at > time.monotonic():
            timeout = min(timeout, self.restart_at - time.monotonic())
        try:
            readable, _, _ = select.select(fds, [], [], max(0.0, timeout))
        except (InterruptedError, OSError, ValueError):
            return
        if self.signals.read_fd in readable:
            self.signals.drain_pipe()

    def read_reports(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            child.read(now)

    # -- signals ------------------------------------------------------------------------

    def dispatch_signals(self) -> None:
        while (signum := self.signals.pop()) is not None:
            name = signal_name(signum).lower()
            handler = getattr(self, f"handle_{name}", None)
            if handler is not None:
                handler()

    def handle_sigterm(self) -> None:
        self.stop(fast=False)

    def handle_sigint(self) -> None:
        self.stop(fast=self.stopping is not None)  # the second Ctrl-C is a fast stop

    def handle_sigquit(self) -> None:
        self.stop(fast=True)

    def handle_sighup(self) -> None:
        if self.stopping:
            return
        if self.app_target and self._reimport is not None:
            try:
                self.app = self._reimport(self.app_target)
            except Exception:
                log.exception(
                    "reload: importing %s failed; children keep the running code", self.app_target
                )
                return
            gc.collect()
            gc.freeze()
        self.generation += 1
        emit(log, "supervisor.reload", generation=self.generation)

    def handle_sigttin(self) -> None:
        self._set_target(self.target + 1)

    def handle_sigttou(self) -> None:
        self._set_target(self.target - 1)

    def _set_target(self, n: int) -> None:
        low, high = self.config.autoscale or (1, 10_000)
        self.target = max(low, min(high, n))
        emit(log, "supervisor.scale", workers=self.target)

    def stop(self, *, fast: bool) -> None:
        """Begin (or hurry) shutdown: children finish within grace, the rest is released."""
        if self.stopping is StopMode.FAST or (self.stopping is StopMode.GRACEFUL and not fast):
            return
        self.stopping = mode = StopMode.FAST if fast else StopMode.GRACEFUL
        budget = self.config.stop_budget(mode)
        self.deadline = time.monotonic() + budget
        emit(
            log,
            "supervisor.stopping",
            mode=self.stopping,
            children=len(self.children),
            deadline_in=round(budget, 1),
        )
        self.notifier.stopping(self.config.stop_timeout(mode))
        for child in self.children.values():
            child.retiring = child.retiring or RetireReason.SHUTDOWN
            self._signal(child, signal.SIGQUIT if fast else signal.SIGTERM)

    # -- children -----------------------------------------------------------------------

    def maintain_count(self) -> None:
        """Start missing children (after any restart backoff); retire extra ones."""
        if self.stopping:
            return
        live = self._live()
        if len(live) > self.target:
            for child in sorted(live, key=lambda c: c.started)[self.target :]:
                self.retire(child, RetireReason.SCALE_DOWN)
            return
        now = time.monotonic()
        while len(live) < self.target and now >= self.restart_at:
            live.append(self.spawn())

    def spawn(self) -> Child:
        used = {c.index for c in self.children.values()}
        index = next(i for i in range(1, len(used) + 2) if i not in used)
        nonce = secrets.token_hex(3)
        read_fd, write_fd = os.pipe()
        parent_pid = os.getpid()
        # Signals are held back across the fork: one that reached the child before it
        # dropped the parent's handlers would be swallowed by them (a SIGTERM lost, a
        # child that never stops). Pending ones arrive once each side is ready.
        with self.ops.fork_lock, self.signals.held():  # the ops thread is idle, no connection
            pid = os.fork()
            if pid == 0:  # the child: nothing of the parent's loop survives here
                self.signals.reset_in_child()
        if pid == 0:
            os.close(read_fd)
            for other in self.children.values():
                other.close()
            self.ops.close_in_child()
            child_main(
                self.app,
                self.config,
                ChildSpec(index, self.target, make_owner(os.getpid(), nonce), write_fd, parent_pid),
            )
        os.close(write_fd)
        os.set_blocking(read_fd, False)
        now = time.monotonic()
        child = Child(pid, index, make_owner(pid, nonce), read_fd, now, now)
        child.generation = self.generation
        child.on_metrics = self.totals.add
        child.idle_since = now
        self.children[pid] = child
        emit(log, "child.started", pid=pid, index=index, owner=child.owner)
        return child

    def retire(self, child: Child, why: RetireReason) -> None:
        """Ask a child to finish its jobs and exit (no attribution: it is not failing)."""
        child.retiring = why
        self._signal(child, signal.SIGTERM)
        emit(log, "child.retiring", pid=child.pid, reason=why)

    def kill(self, child: Child, why: KillReason, cause: str, *, at_once: bool = False) -> None:
        """Kill a child for `cause` (which its jobs will carry): TERM, then KILL."""
        if child.killing:
            return
        child.killing = Kill(why, cause)
        child.kill_at = time.monotonic() + (0 if at_once else self.config.kill_grace)
        self._signal(child, signal.SIGKILL if at_once else signal.SIGTERM)
        emit(log, "child.killing", logging.WARNING, pid=child.pid, reason=cause)

    def _signal(self, child: Child, signum: int) -> None:
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:
            pass

    def reap(self) -> None:
        """Collect every exited child; record its death on the jobs it held."""
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            child.read(time.monotonic())
            child.close()
            self.on_exit(child, status, usage.ru_maxrss * 1024)

    def on_exit(self, child: Child, status: int, peak_rss: int) -> None:
        """Apply the exit's verdict: record it on the jobs, log it, count the restart."""
        now = time.monotonic()
        cause = child.killing.cause if child.killing else None
        exit_status = ExitStatus.of(status, max(peak_rss, child.peak_rss), cause)
        verdict = decide(child.facts(now), exit_status, stopping=self.stopping is not None)
        if verdict.jobs is not None:
            self._record(child.owner, verdict.error, verdict.jobs)
        self._log_exit(child, verdict, now - child.started)
        if verdict.restart_reason is not None:
            self.totals.restart(verdict.restart_reason)
        self._count_restart(verdict.counts, now, now - child.started)

    def _log_exit(self, child: Child, verdict: Verdict, uptime: float) -> None:
        fields: dict[str, object] = {"pid": child.pid, "index": child.index}
        fields["reason"] = verdict.reason
        if verdict.quiet:
            fields["retiring"] = child.retiring or "on its own"
        fields["uptime"] = round(uptime, 1)
        emit(log, "child.exited", verdict.level, **fields)

    def _count_restart(self, counts: RestartCount, now: float, uptime: float) -> None:
        if counts is RestartCount.CLEAN:
            if uptime >= self.restarts.fast_crash:
                self.restarts.healthy()
            return
        if counts is RestartCount.NONE:
            return
        delay = self.restarts.crashed(now, uptime)
        was_loop, self.crash_loop = self.crash_loop, self.restarts.in_crash_loop(now)
        if self.crash_loop and not was_loop:
            emit(
                log,
                "supervisor.crash_loop",
                logging.ERROR,
                crashes=self.restarts.loop_crashes,
                window=self.restarts.window,
            )
            self.notifier.status("workers are crash-looping")
        if delay > 0:
            self.restart_at = max(self.restart_at, now + delay)
            emit(log, "child.restart_backoff", logging.WARNING, delay=round(delay, 2))
        elif not self.crash_loop:
            self.restart_at = now

    def _record(self, owner: str, how: str, mode: JobsAction) -> None:
        """Attribute a death to the owner's jobs now; queue it if the database is away."""
        try:
            self._apply(owner, how, mode)
        except DatabaseError as exc:
            emit(log, "child.attribution_deferred", logging.WARNING, owner=owner, error=exc)
            self.pending.append((owner, how, mode))

    def _apply(self, owner: str, how: str, mode: JobsAction) -> None:
        if mode is JobsAction.RELEASE:
            for gone in self.store.job_release_owner(owner):
                self.totals.job(gone.queue, gone.task, "released")
                emit(log, "job.released", job=gone.id, owner=owner, reason=how)
            return
        for job in self.store.job_fail_orphaned(owner, how):
            self.totals.job(job.queue, job.task, "crashed")
            dead = job.state == "dead"
            emit(
                log,
                "job.dead" if dead else "job.failed",
                logging.ERROR if dead else logging.WARNING,
                job=job.id,
                attempt=job.attempts,
                owner=owner,
                error=how,
            )

    def retry_pending(self) -> None:
        """Retry deferred attributions, backing off while the database stays away."""
        if not self.pending or time.monotonic() < self._pending_at:
            return
        pending, self.pending = self.pending, []
        for owner, how, mode in pending:
            self._record(owner, how, mode)
        if self.pending:
            self._pending_delay = min(30.0, self._pending_delay * 2)
        else:
            self._pending_delay = 1.0
        self._pending_at = time.monotonic() + self._pending_delay

    # -- policing -----------------------------------------------------------------------

    def enforce_timeouts(self) -> None:
        """A job past its task's timeout: charge it now, then kill its child."""
        now = time.monotonic()
        for child in list(self.children.values()):
            for job in list(child.jobs.values()):
                if not job.overdue(now) or job.job_id in child.timed_out:
                    continue
                assert job.timeout is not None
                reason = f"job {job.task}#{job.job_id} timed out after {job.timeout:g} s"
                try:
                    for hit in self.store.job_fail_orphaned(
                        child.owner, f"TimeoutError: {reason}", ids=[job.job_id]
                    ):
                        self.totals.job(hit.queue, hit.task, "crashed")
                        emit(
                            log,
                            "job.timed_out",
                            logging.ERROR,
                            job=hit.id,
                            state=hit.state,
                            attempt=hit.attempts,
                            owner=child.owner,
                        )
                    child.timed_out.append(job.job_id)
                except DatabaseError as exc:
                    # Charged on the child's death instead, with the same reason.
                    emit(log, "job.timeout_record_failed", logging.ERROR, job=job.job_id, error=exc)
                self.kill(child, KillReason.TIMEOUT, reason)

    def enforce_memory(self) -> None:
        """Kill a child far past the memory limit before the kernel's OOM killer does."""
        limit = self.config.max_memory_per_child
        if limit is None:
            return
        hard = limit * self.config.hard_memory_factor * 2**20
        for child in list(self.children.values()):
            rss = rss_of(child.pid)
            child.peak_rss = max(child.peak_rss, rss)
            if rss > hard and not child.killing:
                self.kill(
                    child,
                    KillReason.MEMORY,
                    f"memory limit: RSS {rss / 2**20:.0f} MiB passed "
                    f"{self.config.hard_memory_factor:g} x the {limit:g} MiB limit",
                    at_once=True,
                )

    def kill_unresponsive(self) -> None:
        now = time.monotonic()
        for child in list(self.children.values()):
            silent = now - child.last_seen
            if silent > self.config.child_timeout and not child.killing:
                self.kill(
                    child,
                    KillReason.UNRESPONSIVE,
                    f"unresponsive: no report for {silent:.0f} s",
                    at_once=True,
                )

    def escalate_kills(self) -> None:
        now = time.monotonic()
        for child in self.children.values():
            if child.kill_at is not None and now >= child.kill_at:
                self._signal(child, signal.SIGKILL)
                child.kill_at = now + 1.0

    def enforce_deadline(self) -> None:
        """Past the shutdown budget: SIGKILL what is left (its jobs get released on reap)."""
        if self.deadline is None or time.monotonic() < self.deadline:
            return
        for child in self.children.values():
            self._signal(child, signal.SIGKILL)
        self.deadline = time.monotonic() + 1.0

    # -- reload and scaling -------------------------------------------------------------

    def roll_reload(self) -> None:
        """Replace children of an older generation one at a time (no job is dropped)."""
        if self.stopping:
            return
        if any(c.retiring is RetireReason.RELOAD for c in self.children.values()):
            return
        stale = [c for c in self._live() if c.generation < self.generation]
        if stale:
            self.retire(min(stale, key=lambda c: c.started), RetireReason.RELOAD)

    def autoscale(self) -> None:
        if self.autoscaler is None or self.stopping:
            return
        now = time.monotonic()
        if now < self._next_autoscale:
            return
        self._next_autoscale = now + AUTOSCALE_EVERY
        try:
            backlog = self.store.job_backlog(self.config.worker.queues)
        except DatabaseError:
            return
        live = self._live()
        slots = self.config.worker.concurrency
        busy = sum(1 for c in live if len(c.jobs) >= slots)
        idle = [now - c.idle_since for c in live if c.idle_since is not None]
        delta = self.autoscaler.decide(now, len(live), backlog, busy, max(idle, default=0.0))
        if delta:
            self._set_target(len(live) + delta)

    def update_title(self) -> None:
        state = self.stopping or ("crash loop" if self.crash_loop else "running")
        busy = sum(1 for c in self.children.values() if c.busy)
        setproctitle(
            f"forklift supervisor [{','.join(self.config.worker.queues)}]: {state}, "
            f"{len(self.children)}/{self.target} workers, {busy} busy"
        )
