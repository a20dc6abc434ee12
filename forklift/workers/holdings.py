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
        # Kept as they change, not counted from `_jobs` (hundreds of jobs claimed ahead,
        # looked at several times a claim): jobs claimed whose handler has not started,
        # and those whose handler runs now, by id.
        self._waiting = 0
        self._running: dict[int, JobContext] = {}
        self._doubted = False  # see doubt()

    def __len__(self) -> int:
        return len(self._jobs)

    def free(self, ahead: int = 0, leaving: int = 0) -> tuple[int, int]:
        """(jobs to claim now, jobs held): the free slots, plus `ahead` claimed ahead;
        `leaving` held jobs have their completions written in the claim's own
        transaction, so they are not held once it has claimed."""
        with self._lock:
            # A slot frees when its handler returns; its completion may still be on its
            # way to the database (group commit), which must not hold up the next claim.
            # But completions waiting for a slow database count too: never hold more
            # than twice the slots (and the jobs ahead), or leases pile up faster than
            # they can be renewed.
            held = len(self._jobs)
            room = min(
                self.concurrency + ahead - self._busy,
                2 * self.concurrency + ahead - (held - leaving),
            )
            return room, held

    def adopt(self, ctx: JobContext) -> None:
        """Hold a job just claimed; it takes a slot."""
        with self._lock:
            if (displaced := self._jobs.get(ctx.job_id)) is not None:
                self._uncount(displaced)  # its lease was lost, and the job claimed again
            self._jobs[ctx.job_id] = ctx
            self._busy += 1
            self._waiting += 1

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
            if self._jobs.get(ctx.job_id) is ctx:
                del self._jobs[ctx.job_id]
            return freed

    def start(self, ctx: JobContext, now: float) -> bool:
        """Mark a claimed job started (its handler is about to run); False if it was
        taken to be given back while it waited (`take_waiting`), or is no longer to run
        (started already, ended, released)."""
        with self._lock:
            if ctx.giving_back:
                ctx.passed_over = True  # `keep_waiting` hands it back to an executor
                return False
            if ctx.started or ctx.finished or ctx.slot_freed:
                return False
            if self._jobs.get(ctx.job_id) is not ctx:
                return False
            ctx.started, ctx.started_at = True, now
            self._waiting -= 1
            self._running[ctx.job_id] = ctx
            return True

    def take_waiting(self) -> list[JobContext]:
        """The jobs claimed but not started, marked so that no executor starts them: to
        be given back (they would wait too long, or the worker is stopping)."""
        with self._lock:
            waiting = [
                c
                for c in self._jobs.values()
                if not c.started and not c.slot_freed and not c.giving_back
            ]
            for ctx in waiting:
                ctx.giving_back = True
            return waiting

    def take_running(self) -> list[JobContext]:
        """The held jobs whose handler has not returned (or not started), marked so that
        none is started or has its outcome recorded: to be given back at the stop."""
        with self._lock:
            running = [c for c in self._jobs.values() if not c.slot_freed]
            for ctx in running:
                ctx.giving_back = True
            return running

    def keep_waiting(self, contexts: list[JobContext]) -> list[JobContext]:
        """Jobs `take_waiting` marked stay this worker's after all (their give-back
        failed): an executor may start them, or the next give-back take them. Returns
        those an executor passed over meanwhile, to be queued for one again (else they
        would hold their slots for good, run by no one)."""
        with self._lock:
            passed = [c for c in contexts if c.passed_over]
            for ctx in contexts:
                ctx.giving_back = ctx.passed_over = False
            return passed

    def longest_running(self, now: float) -> float:
        """Seconds the longest-running handler has run (0 when none runs)."""
        with self._lock:
            ages = [now - c.started_at for c in self._running.values()]
        return max(ages, default=0.0)

    def waiting(self) -> int:
        """How many claimed jobs wait for a slot."""
        return self._waiting

    def idle(self) -> bool:
        """Whether no slot is taken: no handler runs and no claimed job waits (successes
        may still wait for their completion to be written)."""
        return self._busy == 0

    def snapshot(self) -> list[JobContext]:
        with self._lock:
            return list(self._jobs.values())

    def ids(self) -> list[int]:
        """The ids of every job held."""
        with self._lock:
            return list(self._jobs)

    def doubt(self) -> None:
        """A write over held jobs lost its answer (a claim, or an outcome given up
        after a lost connection): the database may hold jobs for this worker that it
        does not hold any more. The claim loop reconciles before its next claim."""
        self._doubted = True

    def take_doubt(self) -> bool:
        """Whether doubt() was called since the last call; cleared."""
        with self._lock:
            doubted, self._doubted = self._doubted, False
        return doubted

    def running(self) -> list[JobContext]:
        """The held jobs whose handler has not returned."""
        return [c for c in self.snapshot() if not c.slot_freed]

    def _free_slot(self, ctx: JobContext) -> bool:
        if ctx.slot_freed:
            return False
        if self._jobs.get(ctx.job_id) is ctx:
            self._uncount(ctx)
        ctx.slot_freed = True
        self._busy -= 1
        return True

    def _uncount(self, ctx: JobContext) -> None:
        """Take a held job out of the waiting count or the running ones (its slot is
        freed, or another claim of the same job took its place)."""
        if ctx.slot_freed:
            return
        if not ctx.started:
            self._waiting -= 1
        elif self._running.get(ctx.job_id) is ctx:
            del self._running[ctx.job_id]
