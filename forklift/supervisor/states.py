"""The supervisor's states and its children's, as StrEnums (their values are log words)."""

from __future__ import annotations

from enum import StrEnum


class StopMode(StrEnum):
    """How the supervisor is stopping: let jobs finish within grace, or release them now."""

    GRACEFUL = "graceful"
    FAST = "fast"


class RetireReason(StrEnum):
    """Why a child is leaving without failing (its jobs are not charged for it)."""

    # The child retired itself (max jobs per child, or past the soft memory limit); the
    # parent never sets it, it is the reason a clean exit on its own is replaced for.
    RECYCLE = "recycle"
    SCALE_DOWN = "scale down"
    RELOAD = "reload"
    SHUTDOWN = "shutdown"


class KillReason(StrEnum):
    """Why the supervisor is killing a child (TERM, then KILL)."""

    TIMEOUT = "timeout"
    MEMORY = "memory"
    UNRESPONSIVE = "unresponsive"
    CANCEL = "cancel"  # its job was cancelled and the handler outran --cancel-grace


class JobsAction(StrEnum):
    """What happens to the jobs a dead child still held."""

    FAIL = "fail"  # charged: the attempt counts, retried after backoff or dead
    RELEASE = "release"  # released: ready at once, the attempt not counted
