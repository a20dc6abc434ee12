"""Holdings: the jobs one worker holds, its busy slots, and the locks that guard them."""

from __future__ import annotations

import threading

from forklift.workers.context import JobContext


class Holdings:
    """Every job this worker holds a lease on, and how many of them a handler still runs.

    A job is held from its claim until its outcome is recorded (or it is released); it
    takes a slot from its claim until its handler returns. Group commit sits between
    the two: a job whose handler returned no longer takes a slot, but it is still held,
    and renewed, until its completion is written.

    Lock discipline (no lock is held across a handler; `statement_lock` and an
    `outcome_lock` are never held together; `_lock` is innermost):

    - `_lock` guards the table and the slot count; it is held only to read or change
      them, never across I/O.
    - `statement_lock` is held across a statement over many held leases together with
      the `finished` flags it sets: group completion and release set them, renewal reads
      them. So a renewal never takes a job completed behind its back for a lost lease.
    - a job's own `outcome_lock` is held while its thread writes its outcome (failure,
      completion in the effect transaction) and sets `finished`; renewal takes it
      before calling a lease lost, so a job that just finished is never called lost.
    """

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self.statement_lock = threading.Lock()
        self.ended = 0  # jobs whose outcome was recorded (releases are not counted)
        self._lock = threading.Lock()
        self._jobs: dict[int, JobContext] = {}
        self._busy = 0  # held jobs whose handler has not returned yet

    def __len__(self) -> int:
        return len(self._jobs)

    def free(self) -> tuple[int, int]:
        """(slots free for new claims, jobs held)."""
        with self._lock:
            # A slot frees when its handler returns; its completion may still be on its
            # way to the database (group commit), which must not hold up the next claim.
            # But completions waiting for a slow database count too: never hold more
            # than twice the slots, or leases pile up faster than they can be renewed.
            held = len(self._jobs)
            return min(self.concurrency - self._busy, 2 * self.concurrency - held), held

    def adopt(self, ctx: JobContext) -> None:
        """Hold a job just claimed; it takes a slot."""
        with self._lock:
            self._jobs[ctx.job_id] = ctx
            self._busy += 1

    def free_slot(self, ctx: JobContext) -> bool:
        """Give back the job's slot (its handler returned); False if it was given already."""
        with self._lock:
            return self._free_slot(ctx)

    def end(self, ctx: JobContext) -> None:
        """Forget a job whose outcome is recorded, and count it."""
        with self._lock:
            self._free_slot(ctx)
            if self._jobs.get(ctx.job_id) is ctx:
                del self._jobs[ctx.job_id]
            self.ended += 1

    def release(self, ctx: JobContext) -> bool:
        """Forget a job given back; True if this freed its slot."""
        with self._lock:
            freed = self._free_slot(ctx)
            self._jobs.pop(ctx.job_id, None)
            return freed

    def snapshot(self) -> list[JobContext]:
        with self._lock:
            return list(self._jobs.values())

    def running(self) -> list[JobContext]:
        """The held jobs whose handler has not returned."""
        return [c for c in self.snapshot() if not c.slot_freed]

    def _free_slot(self, ctx: JobContext) -> bool:
        if ctx.slot_freed:
            return False
        ctx.slot_freed = True
        self._busy -= 1
        return True
