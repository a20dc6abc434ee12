"""Reaping: collect every exited child and apply its exit's verdict.

Solid Queue's `replace_fork`, in order: the status becomes an error text, the dead
child's jobs are charged or released with it, the exit is logged and counted. The
replacement is started by the loop's next step (`Supervisor.maintain_count`), after any
restart backoff; a child being killed or retired for a reload was already replaced when
it stopped counting toward the target.
"""

from __future__ import annotations

import logging
import os
import resource
import signal
import time
from collections import Counter
from collections.abc import Callable

from forklift._events import emit
from forklift._ids import application_name
from forklift.metrics import Totals
from forklift.supervisor.child import Child, Children
from forklift.supervisor.deaths import Deaths
from forklift.supervisor.exits import ExitStatus, Verdict, decide
from forklift.supervisor.restarts import RestartSchedule
from forklift.supervisor.store import SupervisorStore

log = logging.getLogger(__name__)

# How long settling a dead child's unanswered group commit waits for its sessions to go.
SESSIONS_GONE = 0.5

# os.wait4, or a scripted one in the unit tests.
Wait4 = Callable[[int, int], tuple[int, int, resource.struct_rusage]]


class Reaper:
    def __init__(
        self,
        children: Children,
        attribution: Deaths,
        totals: Totals,
        restarts: RestartSchedule,
        *,
        wait4: Wait4 = os.wait4,
        settle: Callable[[Child], None] | None = None,
    ) -> None:
        self.children = children
        self.attribution = attribution
        self.totals = totals
        self.restarts = restarts
        self._wait4 = wait4
        # Counts what a dead child's unanswered group commit did (on the database thread).
        self._settle = settle

    def reap(self, *, stopping: bool) -> None:
        """waitpid(-1, WNOHANG) until nothing more has exited."""
        while True:
            try:
                pid, status, usage = self._wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid)
            if child is None:
                continue
            now = time.monotonic()
            child.read(now)  # its last words: a job it ended just before dying
            child.close()
            self.on_exit(child, status, usage.ru_maxrss * 1024, stopping=stopping, now=now)

    def on_exit(
        self, child: Child, status: int, peak_rss: int, *, stopping: bool, now: float
    ) -> Verdict:
        """Decide what the exit means and apply it."""
        cause = child.killing.cause if child.killing else None
        exit = ExitStatus.of(status, max(peak_rss, child.peak_rss), cause)
        facts = child.facts(now)
        verdict = decide(facts, exit, stopping=stopping)
        if not verdict.quiet:
            self.attribution.end_sessions(child.owner)
            # What its handlers started dies with it (forkserver.own_process_group).
            self.children.signal_group(child, signal.SIGKILL)
        if child.unanswered and self._settle is not None:
            self._settle(child)  # after its sessions end: no statement of its runs on
        # Charged now that its handlers have stopped, and before its other jobs go back.
        for job_id, cause in child.timed_out.items():
            self.attribution.charge_timeout(child.owner, job_id, cause, now)
        if verdict.jobs is not None:
            error = verdict.error
            if child.crash_stack:
                error = f"{error}\n{child.crash_stack}"
            self.attribution.record(
                child.owner, error, verdict.jobs, now, running=child.running_at_exit
            )
        _log_exit(child, verdict, facts.uptime)
        if verdict.restart_reason is not None:
            self.totals.restart(verdict.restart_reason)
        self.restarts.count(verdict.counts, child.index, now)
        return verdict


def _log_exit(child: Child, verdict: Verdict, uptime: float) -> None:
    fields: dict[str, object] = {"pid": child.pid, "index": child.index}
    fields["reason"] = verdict.reason
    if verdict.quiet:
        fields["retiring"] = child.retiring or "on its own"
    fields["uptime"] = round(uptime, 1)
    emit(log, "child.exited", verdict.level, **fields)


def settle_unanswered(
    submit: Callable[[str, Callable[[], object]], None],
    store: SupervisorStore,
    totals: Totals,
    child: Child,
) -> None:
    """Count what a dead child's group commit did that it never heard back about: the
    attempts the database says succeeded (on the database thread, `submit`)."""
    jobs = child.unanswered

    def count() -> None:
        # Its sessions were told to end: a statement of its may still be committing
        # until they are gone (half a second at most, then read anyway).
        name = application_name(child.owner)
        deadline = time.monotonic() + SESSIONS_GONE
        while store.backend_count(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        done = store.job_succeeded_among([(job_id, attempt) for job_id, attempt, _ in jobs])
        grown = Counter(key for job_id, _, key in jobs if job_id in done)
        if grown:
            totals.add({"jobs": [[*key, n] for key, n in grown.items()]})
        emit(
            log, "child.unanswered_counted", logging.DEBUG, pid=child.pid, jobs=sum(grown.values())
        )

    submit("unanswered", count)
