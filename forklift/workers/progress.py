"""Writing handlers' progress (ctx.progress): the latest of each running job, at most
every half second, in one statement on the worker's own connection, on a thread of its
own, so a handler reporting in a tight loop never waits on the database."""

from __future__ import annotations

import json
import logging
import threading
import time

from forklift._events import emit
from forklift._service import run_every
from forklift.errors import DatabaseError
from forklift.store import JobStore, job_checkpoint_many
from forklift.workers.context import JobContext
from forklift.workers.holdings import Holdings

log = logging.getLogger(__name__)

EVERY = 0.5  # seconds between writes: a job's progress is at most this stale


class ProgressWriter:
    def __init__(
        self, store: JobStore, owner: str, holdings: Holdings, closing: threading.Event
    ) -> None:
        self.store = store
        self.owner = owner
        self.holdings = holdings
        self.closing = closing

    def run(self) -> None:
        run_every(EVERY, self.run_once, self.closing, log, "job.progress_failed")

    def run_once(self) -> int:
        """Write what changed since the last round; how many jobs' progress it wrote."""
        changed, saved = [], []
        now = time.monotonic()
        for ctx in self.holdings.running():  # a returned one's goes with its completion
            text = unwritten(ctx)
            if text is not None:
                changed.append((ctx.job_id, ctx.attempt, text))
            if ctx._resumable is not None and (doc := ctx._resumable.due(now)) is not None:
                saved.append((ctx, doc))
        if saved:
            self._checkpoints(saved)
        if changed:
            try:
                self.store.job_progress_many(changed, self.owner)
            except DatabaseError as exc:
                if not exc.row_dependent:
                    raise
                self._one_by_one(changed)
        return len(changed)

    def _checkpoints(self, saved: list[tuple[JobContext, str]]) -> None:
        """Write the checkpoints due (ctx.checkpoint, ctx.iterate's cursors) in one
        statement; failing, each is written again at the next round."""
        try:
            held = [(c.job_id, c.attempt, doc) for c, doc in saved]
            job_checkpoint_many(self.store, held, self.owner)
        except DatabaseError:
            for ctx, _ in saved:
                assert ctx._resumable is not None
                ctx._resumable.unsent()
            raise

    def _one_by_one(self, changed: list[tuple[int, int, str]]) -> None:
        """Write each report alone: one the database refuses (bad data) must not cost
        the others theirs. The refused one is dropped, said once."""
        for report in changed:
            try:
                self.store.job_progress_many([report], self.owner)
            except DatabaseError as exc:
                if not exc.row_dependent:
                    raise
                emit(log, "job.progress_dropped", logging.WARNING, job=report[0], error=exc)


def unwritten(ctx: JobContext) -> str | None:
    """The job's latest progress as JSON if it is not written yet (and from now on it
    counts as written: a later call is written next time)."""
    now = ctx.progress_now
    if not ctx.progress_dirty or now is None:
        return None
    ctx.progress_dirty = False
    done, total, message = now
    try:
        return json.dumps({"done": done, "total": total, "message": message}, allow_nan=False)
    except ValueError:  # NaN or infinity: jsonb takes neither; not worth a failed write
        return None
