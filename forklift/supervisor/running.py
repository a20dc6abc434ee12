"""Which jobs' handlers a child is running, in memory its supervisor shares: a worker's
death is charged to those jobs, and only those.

A child holds more jobs than it runs: jobs claimed ahead wait for a slot, and jobs whose
handler returned wait for their group commit. When the child dies, only a handler that
was running can have killed it. So the child marks a job here as its handler starts and
unmarks it as the handler returns (or raises), each one aligned 8-byte store into a
region mapped before the fork; its supervisor reads the marks once the child has exited
and charges a crash to the marked jobs alone, giving the others back uncharged
(deaths.py). A mark costs a dictionary look-up and a store: no report, no system call.

Layout: one u64 header (1: the child once ran more handlers at once than there are
entries, so the marks are incomplete and every job it held is charged, as before), then
ENTRIES u64 job ids; 0 is a free entry. Only the child writes. The supervisor trusts
nothing in it: it passes the ids to statements fenced by the child's owner id, so a
stray number charges nothing.
"""

from __future__ import annotations

import mmap

ENTRIES = 4096  # handlers running at once in one child (async ones included)
SIZE = 8 * (1 + ENTRIES)
OVERFLOWED = 1


class RunningHandlers:
    """One child's marks. The child calls `began()` and `returned()` (under one lock of
    its own); the parent calls `running()` after the child exited."""

    def __init__(self, fd: int = -1) -> None:
        # Anonymous (shared with the child forked after), or the file `fd` (a memfd the
        # supervisor maps and hands to its fork server for the child).
        self.region = mmap.mmap(fd, SIZE)
        self._words = memoryview(self.region).cast("Q")
        self._entry: dict[int, int] = {}  # the child's: job id -> its entry
        self._free: list[int] = []  # the child's: entries freed, reused first
        self._used = 0  # the child's: entries ever taken

    # -- the child -----------------------------------------------------------------------

    def began(self, job_id: int) -> None:
        """The job's handler is about to run."""
        if job_id in self._entry:
            return
        if self._free:
            entry = self._free.pop()
        elif self._used < ENTRIES:
            entry = self._used
            self._used += 1
        else:
            self._words[0] = OVERFLOWED
            return
        self._entry[job_id] = entry
        self._words[1 + entry] = job_id

    def returned(self, job_id: int) -> None:
        """The job's handler returned or raised: its death is no longer its doing."""
        entry = self._entry.pop(job_id, None)
        if entry is not None:
            self._words[1 + entry] = 0
            self._free.append(entry)

    # -- the parent ----------------------------------------------------------------------

    def running(self) -> tuple[int, ...] | None:
        """The jobs whose handlers ran when the child exited; None if it cannot tell."""
        if self._words[0] != 0:
            return None
        return tuple(sorted({int(w) for w in self._words[1:] if w and w < 2**63}))

    def close(self) -> None:
        self._words.release()
        self.region.close()
