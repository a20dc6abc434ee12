"""What one child's exit means: a pure decision, a table a unit test can read row by row,
and the exit in words an operator can act on (`describe_exit`).

`decide()` takes what the supervisor knew about the child and how it exited and returns
a frozen `Verdict`; the reaper only applies it (Solid Queue's `replace_fork`).
"""

from __future__ import annotations

import logging
import os
import signal
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

from forklift.supervisor.states import JobsAction, KillReason, RetireReason

# The label of forklift_worker_restarts_total{reason}.
RestartReason = KillReason | RetireReason | Literal["crash"]

_LIKELY: dict[int, str] = {
    signal.SIGKILL.value: "possibly out of memory (kernel OOM killer) or killed by an operator",
    signal.SIGSEGV.value: "segmentation fault, usually in native code",
    signal.SIGBUS.value: "bus error, usually in native code",
    signal.SIGABRT.value: "aborted, usually by native code",
    signal.SIGFPE.value: "arithmetic fault in native code",
    signal.SIGILL.value: "illegal instruction in native code",
    signal.SIGTERM.value: "terminated by someone other than this supervisor",
}


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def describe_exit(status: int, peak_rss_bytes: int | None = None, cause: str | None = None) -> str:
    """Turn a waitpid status into e.g. 'killed by SIGKILL: possibly out of memory ...'.

    `cause` is what the supervisor itself knows (it killed the child for a reason).
    """
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        text = f"WorkerDied: worker process killed by {signal_name(signum)}"
        reason = cause or _LIKELY.get(signum)
        if reason:
            text += f": {reason}"
    elif os.WIFEXITED(status):
        code = os.WEXITSTATUS(status)
        text = f"WorkerDied: worker process exited with code {code}"
        if cause:
            text += f": {cause}"
    else:
        text = f"WorkerDied: worker process ended with status {status}"
    if peak_rss_bytes:
        text += f" (peak RSS {peak_rss_bytes / 2**20:.0f} MiB)"
    return text


class RestartCount(StrEnum):
    """What an exit does to its slot's restart backoff (see restarts.py)."""

    BOOT_CRASH = "boot crash"  # it died before its worker loop ran: the slot backs off
    BOOTED = "booted"  # it had booted, whatever ended it: the slot's streak is over
    NONE = "none"  # it left before booting, asked to or cleanly: not counted


@dataclass(frozen=True)
class ChildFacts:
    """What the supervisor knew of a child when it exited."""

    retiring: RetireReason | None = None
    killing: KillReason | None = None
    # One of its jobs was already charged for overrunning its timeout (before the kill).
    timeout_charged: bool = False
    held_jobs: bool = False
    uptime: float = 0.0
    booted: bool = False  # its worker loop ran (it said so on its report pipe)


@dataclass(frozen=True)
class ExitStatus:
    """How a child exited: its wait status in words, and whether that was exit code 0."""

    described: str
    clean: bool

    @classmethod
    def of(cls, status: int, peak_rss: int = 0, cause: str | None = None) -> ExitStatus:
        clean = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
        return cls(describe_exit(status, peak_rss, cause), clean)


@dataclass(frozen=True)
class Verdict:
    """What to do about one exited child."""

    jobs: JobsAction | None  # None: nothing to record on its jobs
    error: str  # what its jobs carry when charged or released: the status described
    replaced: bool  # a replacement is due (the loop's maintain_count starts it)
    restart_reason: RestartReason | None  # None when not replaced
    counts: RestartCount
    level: int  # of the child.exited log line
    quiet: bool  # a clean exit of its own accord: an exit, not a death

    @property
    def reason(self) -> str:
        """The child.exited line's reason."""
        return "clean exit" if self.quiet else self.error


def decide(child: ChildFacts, exit: ExitStatus, *, stopping: bool) -> Verdict:
    """The one decision per child exit."""
    killed = child.killing is not None
    quiet = exit.clean and not killed  # an exit, not a death
    replaced = not stopping and child.retiring not in (
        RetireReason.SHUTDOWN,
        RetireReason.SCALE_DOWN,
    )
    reason: RestartReason = (
        child.killing or child.retiring or (RetireReason.RECYCLE if quiet else "crash")
    )
    if child.booted:
        counts = RestartCount.BOOTED
    elif quiet or child.retiring or stopping or child.killing is KillReason.CANCEL:
        counts = RestartCount.NONE  # an operator's cancel is no sign of a crash loop
    else:
        counts = RestartCount.BOOT_CRASH
    if quiet:
        level = logging.INFO
    else:
        level = logging.WARNING if killed or child.retiring else logging.ERROR
    return Verdict(
        jobs=_jobs_action(child, exit),
        error=exit.described,
        replaced=replaced,
        restart_reason=reason if replaced else None,
        counts=counts,
        level=level,
        quiet=quiet,
    )


def _jobs_action(child: ChildFacts, exit: ExitStatus) -> JobsAction | None:
    if child.killing is not None:
        # Killed for a timeout: the overdue job was charged before the kill, the others
        # were bystanders. Killed for a cancel: the cancelled job is not its any more,
        # the others were bystanders. Killed for anything else: the kill is the jobs'
        # failure.
        bystanders = child.timeout_charged or child.killing is KillReason.CANCEL
        return JobsAction.RELEASE if bystanders else JobsAction.FAIL
    if child.retiring is RetireReason.SHUTDOWN and not exit.clean:
        return JobsAction.RELEASE  # killed at the shutdown deadline
    if not exit.clean or child.held_jobs:
        return JobsAction.FAIL
    return None
