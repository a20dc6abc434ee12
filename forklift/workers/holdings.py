"""Holdings: the jobs one worker holds, its busy slots, and who writes each outcome."""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from forklift.workers.context import JobContext, Stage, Writing

# The stages in which a job takes a slot.
SLOTTED = (Stage.WAITING, Stage.PASSED, Stage.RUNNING)


class Holdings:
    """Every job this worker holds a lease on, and how many of them a handler still runs.

    A job is held from its claim until its outcome is recorded (or it is released); it
    takes a slot from its claim until its handler returns. Group commit sits between
    the two: a job whose handler returned no longer takes a slot, but it is still held,
    and renewed, until its completion is written.

    Lock discipline: one lock, `_lock`, never held across I/O nor a handler. It guards
    the table, the slot counts and each held job's `stage`; under it a job's outcome
    (its success, failure or release) is taken by one thread (`take`, `take_waiting`,
    `take_running`: `writing` from NONE to TAKEN) before that thread sends the write.
    Only the thread that took an outcome writes it, marks it WRITTEN, or lets it go
    (`untake`, when its release failed). So the renewer, finding a lease gone, calls it
    lost only if its outcome was not taken when the renewal's answer came: a lease our
    own write ended was taken before that write was sent, so before the renewal ran.
    """

    def __init__(self, concurrency: int, costs: Mapping[str, int] | None = None) -> None:
        self.concurrency = concurrency
        # The slots a job of each task that costs more than one takes (workers/slots.py).
        self.costs = costs or {}
        self.ended = 0  # jobs whose outcome was recorded (releases are not counted)
        self._lock = threading.Lock()
        self._jobs: dict[int, JobContext] = {}
        self._busy = 0  # the slots of the held jobs whose handler has not returned yet
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
            self._busy += self.costs.get(ctx.task, 1)
            self._waiting += 1

    def free_slot(self, ctx: JobContext) -> bool:
        """Free the job's slot (its handler returned); False if it was freed already."""
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
        """Forget a job released; True if this freed its slot."""
        with self._lock:
            freed = self._free_slot(ctx)
            if self._jobs.get(ctx.job_id) is ctx:
                del self._jobs[ctx.job_id]
            return freed

    def start(self, ctx: JobContext, now: float) -> bool:
        """Mark a claimed job started (its handler is about to run); False if its
        outcome was taken while it waited (it is being released: `take_waiting`), or it
        is no longer to run (started already, ended, released)."""
        with self._lock:
            if ctx.writing is not Writing.NONE:
                if ctx.stage is Stage.WAITING:
                    ctx.stage = Stage.PASSED  # `untake` hands it back to an executor
                return False
            if ctx.stage is not Stage.WAITING or self._jobs.get(ctx.job_id) is not ctx:
                return False
            ctx.stage, ctx.started_at = Stage.RUNNING, now
            self._waiting -= 1
            self._running[ctx.job_id] = ctx
            return True

    def take(self, contexts: Iterable[JobContext]) -> list[JobContext]:
        """Take the outcomes of these jobs, for the caller alone to write: those no other
        thread took (released, or being)."""
        with self._lock:
            taken = [c for c in contexts if c.writing is Writing.NONE]
            for ctx in taken:
                ctx.writing = Writing.TAKEN
        return taken

    def take_waiting(self, *, reserved: bool = False) -> list[JobContext]:
        """The jobs claimed but not started, taken so that no executor starts them: to
        be released (they would wait too long, or the worker is stopping). `reserved`:
        but the first, where jobs cost slots (workers/slots.py): a job claimed into free
        slots too few for it waits for its own, its place kept (Claimer._fitted). Given
        back, it was claimed again at once by this worker, whose free slots it did not
        fit either: a claim and a release every few milliseconds."""
        with self._lock:
            waiting = [
                c
                for c in self._jobs.values()
                if c.stage is Stage.WAITING and c.writing is Writing.NONE
            ]
            if reserved and self.costs:
                waiting = waiting[1:]
            for ctx in waiting:
                ctx.writing = Writing.TAKEN
            return waiting

    def take_running(self) -> list[JobContext]:
        """The held jobs whose handler has not returned (or not started), taken so that
        none is started or has its outcome written by another: to be released at the
        stop."""
        with self._lock:
            running = [
                c for c in self._jobs.values() if c.stage in SLOTTED and c.writing is Writing.NONE
            ]
            for ctx in running:
                ctx.writing = Writing.TAKEN
            return running

    def untake(self, contexts: list[JobContext]) -> list[JobContext]:
        """Jobs taken to be released stay this worker's after all (their release
        failed): an executor may start them, a handler's return write them, or the next
        release take them. Returns those an executor passed over meanwhile, to be queued
        for one again (else they would hold their slots for good, run by no one)."""
        with self._lock:
            passed = [c for c in contexts if c.stage is Stage.PASSED]
            for ctx in contexts:
                ctx.writing = Writing.NONE
            for ctx in passed:
                ctx.stage = Stage.WAITING
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
        return [c for c in self.snapshot() if c.stage in SLOTTED]

    def _free_slot(self, ctx: JobContext) -> bool:
        if ctx.stage not in SLOTTED:
            return False
        if self._jobs.get(ctx.job_id) is ctx:
            self._uncount(ctx)
        ctx.stage = Stage.RAN if ctx.stage is Stage.RUNNING else Stage.UNRUN
        self._busy -= self.costs.get(ctx.task, 1)
        return True

    def _uncount(self, ctx: JobContext) -> None:
        """Take a held job out of the waiting count or the running ones (its slot is
        freed, or another claim of the same job took its place)."""
        if ctx.stage is Stage.WAITING or ctx.stage is Stage.PASSED:
            self._waiting -= 1
        elif ctx.stage is Stage.RUNNING and self._running.get(ctx.job_id) is ctx:
            del self._running[ctx.job_id]
