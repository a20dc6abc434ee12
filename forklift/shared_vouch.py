"""Whether a supervisor's liveness lock vouches for its children now, shared with them.

A child's jobs are charged by a peer the moment its supervisor's liveness lock is found
free (VanishedOwners, supervisor/deaths.py): so a child may claim only while that lock
is held, and must stop within a second of its loss. The lock lives on the
supervisor's session connection, which a child cannot see: its own connections may work
while the session is down ("too many clients" on the session's reconnect, a slow connect
at boot).

So the supervisor maps one anonymous shared word before it forks, and its session thread
writes there, every tick it finds its session (and so the lock) still alive, the
CLOCK_MONOTONIC time of that confirmation, and 0 the moment it knows the lock is gone.
A child reads it before each claim: vouched for while the last confirmation is fresher
than `FRESH`. A session thread that stops confirming for any reason (blocked, gone)
stops its children claiming within that time. The word is one aligned 8-byte store,
never torn; the monotonic clock is one for every process of the host.
"""

from __future__ import annotations

import mmap
import time

FRESH = 1.0  # seconds a confirmation vouches for (the session confirms every 0.2 s)
POLL = 0.02  # how often a waiting child looks again


class SharedVouch:
    """The supervisor's session calls `confirm()` and `withdraw()`; a child `wait()`s."""

    def __init__(self, fresh: float = FRESH) -> None:
        self.region = mmap.mmap(-1, mmap.PAGESIZE)  # anonymous: shared with later forks
        self._word = memoryview(self.region).cast("Q")
        self._fresh_ns = int(fresh * 1e9)

    # -- the supervisor's session thread -------------------------------------------------

    def confirm(self) -> None:
        """The lock is held, as of now."""
        self._word[0] = time.monotonic_ns()

    def withdraw(self) -> None:
        """The lock is not held (lost, or not taken yet)."""
        self._word[0] = 0

    # -- a child -------------------------------------------------------------------------

    def vouched(self) -> bool:
        """Whether the lock was confirmed held within the last `fresh` seconds."""
        at = self._word[0]
        return at != 0 and time.monotonic_ns() - at < self._fresh_ns

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the lock to vouch; whether it does."""
        deadline = time.monotonic() + timeout
        while not self.vouched():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            time.sleep(min(POLL, left))
        return True
