"""The policing steps of the loop: kill a child whose job overran its timeout, whose
cancelled job's handler outran the cancel grace, whose memory ran far past the limit, or
that went silent; escalate a kill; SIGKILL what outlives the shutdown deadline."""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from forklift._events import emit
from forklift.supervisor.child import Child, Children, Kill
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.deaths import Deaths
from forklift.supervisor.rss import rss_of
from forklift.supervisor.states import KillReason
from forklift.workers.executor import timed_out

log = logging.getLogger(__name__)

# A child's first report comes half a second after its fork (its heartbeat thread's first
# beat). One still silent this long after its fork never got that far: it is wedged
# between the fork and its boot (in a fork hook of the app's, say, or on a lock a thread
# of a library held at the instant of the fork). It is replaced now, not after
# `child_timeout`.
FIRST_REPORT_TIMEOUT = 10.0


class Police:
    """Each step takes the time of the tick, so a test can call it with any clock."""

    def __init__(
        self,
        config: SupervisorConfig,
        children: Children,
        attribution: Deaths,
        *,
        rss: Callable[[int], int] = rss_of,
    ) -> None:
        self.config = config
        self.children = children
        self.attribution = attribution
        self._rss = rss
        self.deadline: float | None = None  # set by a stop: past it, SIGKILL what is left

    def kill(
        self, child: Child, why: KillReason, cause: str, now: float, *, at_once: bool = False
    ) -> None:
        """Kill a child for `cause` (which its jobs will carry): TERM, then KILL."""
        if child.killing:
            return
        child.killing = Kill(why, cause)
        child.kill_at = now + (0 if at_once else self.config.kill_grace)
        self.children.signal(child, signal.SIGKILL if at_once else signal.SIGTERM)
        emit(log, "child.killing", logging.WARNING, pid=child.pid, reason=cause)
        # Its sessions end now, not when (or if) its process does: a wedged child, or a
        # grandchild that inherited a socket, must not keep an effect transaction open.
        # No peer takes that for its death: its liveness lock is this supervisor's.
        self.attribution.end_sessions(child.owner)

    def enforce_timeouts(self, now: float) -> None:
        """A job past its task's timeout: kill its child, and note the job, which its
        reaper charges (a timeout, never a crash) once the child is dead. Not before:
        until its handler has stopped, the job keeps its limit's slot (a limit is never
        exceeded, not even briefly) and its next attempt waits."""
        for child in self.children:
            for job in list(child.jobs.values()):
                if not job.overdue(now) or job.job_id in child.timed_out:
                    continue
                assert job.timeout is not None
                cause = timed_out(job.task, job.job_id, job.timeout)
                child.timed_out[job.job_id] = cause
                self.kill(child, KillReason.TIMEOUT, cause, now)

    def enforce_cancels(self, now: float) -> None:
        """A cancelled job's handler still running `cancel_grace` after the child heard of
        the cancel: SIGKILL the child (the job is cancelled in the database already, so
        its effect transaction dies with the process; the replacement starts as usual)."""
        grace = self.config.cancel_grace
        for child in self.children:
            for job in list(child.jobs.values()):
                if job.cancelled is None or now - job.cancelled < grace:
                    continue
                cause = f"job {job.task}#{job.job_id} was cancelled and ran on past {grace:g} s"
                self.kill(child, KillReason.CANCEL, cause, now, at_once=True)

    def enforce_memory(self, now: float) -> None:
        """Kill a child far past the memory limit before the kernel's OOM killer does."""
        limit = self.config.max_memory_per_child
        if limit is None:
            return
        factor = self.config.hard_memory_factor
        for child in self.children:
            rss = self._rss(child.pid)
            child.peak_rss = max(child.peak_rss, rss)
            if rss > limit * factor * 2**20 and not child.killing:
                cause = (
                    f"memory limit: RSS {rss / 2**20:.0f} MiB passed "
                    f"{factor:g} x the {limit:g} MiB limit"
                )
                self.kill(child, KillReason.MEMORY, cause, now, at_once=True)

    def kill_unresponsive(self, now: float) -> None:
        """Kill a child that has not reported for `child_timeout` (it is wedged), or has
        not reported at all FIRST_REPORT_TIMEOUT after its fork (wedged before its boot)."""
        timeout = self.config.child_timeout
        for child in self.children:
            silent = now - child.last_seen
            limit = timeout if child.reported else min(timeout, FIRST_REPORT_TIMEOUT)
            if silent <= limit or child.killing:
                continue
            cause = f"unresponsive: no report for {silent:.0f} s"
            if not child.reported:
                cause += " since its fork (wedged before its boot)"
            self.kill(child, KillReason.UNRESPONSIVE, cause, now, at_once=True)

    def escalate_kills(self, now: float) -> None:
        """A killed child still there at its kill_at gets SIGKILL, again each second."""
        for child in self.children:
            if child.kill_at is not None and now >= child.kill_at:
                self.children.signal(child, signal.SIGKILL)
                child.kill_at = now + 1.0

    def enforce_deadline(self, now: float) -> None:
        """Past the shutdown budget: SIGKILL what is left (its jobs get released on reap)."""
        if self.deadline is None or now < self.deadline:
            return
        for child in self.children:
            self.children.signal(child, signal.SIGKILL)
        self.deadline = now + 1.0
