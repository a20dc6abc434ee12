"""drain(): run an app's due jobs to their outcomes with a real worker, in this process,
until none is left."""

from __future__ import annotations

import threading
import time

from forklift.app import App
from forklift.store import ClaimedJob
from forklift.testing._results import SNOOZED, SUCCEEDED, Drained, DrainTimedOut, Ran
from forklift.testing._store import HelperStore, JobEnd
from forklift.workers import Worker, WorkerConfig

# Seconds a round's worker is given to stop once its claims came back empty: it only has
# completions to write by then. (It is told to stop at once, its handlers cancelled and
# released, when the drain's deadline passes instead.)
STOP_WAIT = 10.0


def drain(
    app: App, queue: str | None = None, *, timeout: float = 30.0, with_scheduled: bool = False
) -> Drained:
    """Run every job of `app`'s schema that is ready and due (in `queue`; None: every
    queue), with a real forklift Worker on a thread of this process, until none is left;
    return every attempt that ended and how (Drained: succeeded, failed, dead, each
    with its error). For integration tests on a real database.

    The jobs are claimed, leased, run and completed as in production, by the worker's
    own code: effects commit with their completions, a failure is recorded with its
    backoff (a job that can retry is `failed`, and not run again unless it falls due
    during the drain), a job out of attempts or raising forklift.Fail ends `dead`, limits
    hold. Jobs the handlers enqueue run too, and so do batch callbacks and the workflow
    steps each step's success releases. Handlers run on
    the worker's thread (plain def) or event loop (async def), one job at a time, so
    they see only what is committed (not a test's open transaction), and their
    exceptions are recorded on the jobs, never raised here. This is the test's own
    process: a handler that ends it (os._exit, a crash) ends the test run, and no
    supervisor charges it. Other workers on the same schema, if any, claim too.

    `with_scheduled`: jobs due later (delayed, or retrying after a backoff) are made due
    and run too, before each round, so a job that keeps failing runs until it is dead.
    `timeout`: seconds for the whole drain; past it DrainTimedOut (a handler that does
    not return, or a job that keeps coming due, as one that keeps snoozing would).
    `Drained.left` counts the due jobs no claim took (a limit full, a paused queue).
    """
    store = HelperStore(app.dsn, app.schema)
    deadline = time.monotonic() + timeout
    ran: list[Ran] = []
    while True:
        if with_scheduled:
            store.make_due(queue)
        queues = store.due_queues(queue)
        if not queues:
            return Drained(ran)
        ended, finished = _round(app, queues, deadline)
        ran.extend(_described(store, ended))
        if not finished:
            summary = "\n".join(f"  {r}" for r in ran) or "  nothing"
            raise DrainTimedOut(
                f"drain did not finish within {timeout:g} s (a handler still running, or "
                f"jobs still coming due); what ended meanwhile:\n{summary}"
            )
        if not ended:  # all that is due is held back: no round would take it
            return Drained(ran, left=store.due_count(queue))


def _round(
    app: App, queues: list[str], deadline: float
) -> tuple[list[tuple[ClaimedJob, str]], bool]:
    """One worker claims from `queues` until a claim finds nothing; then it is stopped,
    which writes every outcome it holds. The (job, outcome) of each attempt that ended,
    in order, and whether it got there before `deadline` (else it was stopped at once)."""
    ended: list[tuple[ClaimedJob, str]] = []
    config = WorkerConfig(
        queues=tuple(queues), concurrency=1, prefetch=False, listen=False, maintenance=False
    )
    worker = Worker(app, config, on_job_end=lambda job, outcome: ended.append((job, str(outcome))))
    worker.idle.enable()
    failed: list[BaseException] = []
    thread = threading.Thread(
        target=_run, args=(worker, failed), name="forklift-drain", daemon=True
    )
    thread.start()
    idle = False
    try:
        worker.idle.wait(max(0.001, deadline - time.monotonic()))
        idle = not failed
    except AssertionError:  # no idle claim by the deadline
        pass
    finally:
        worker.request_stop(fast=not idle)
        thread.join(STOP_WAIT)
    if failed:
        raise failed[0]
    return ended, idle and not thread.is_alive()


def _run(worker: Worker, failed: list[BaseException]) -> None:
    """Worker.run() on the drain's thread: what it raises is kept for the drain to raise,
    and the drain is woken either way."""
    try:
        worker.run()
    except BaseException as exc:
        failed.append(exc)
    finally:
        worker.idle.emit(None)


def _described(store: HelperStore, ended: list[tuple[ClaimedJob, str]]) -> list[Ran]:
    """Each attempt that ended, with what its job's row says of it: its result (a
    success), or its error and traceback (the error history's entry for its attempt)."""
    rows = store.ends([job.id for job, _ in ended]) if ended else {}
    return [_ran(job, outcome, rows.get(job.id)) for job, outcome in ended]


def _ran(job: ClaimedJob, outcome: str, end: JobEnd | None) -> Ran:
    # A snooze writes no error; the attempt it gave back is another run's, whose error
    # (if it failed) is that run's, not the snooze's.
    errors = []
    if end is not None and outcome != SNOOZED:
        errors = [e for e in end.errors if e.get("attempt") == job.attempt]
    error = errors[-1] if errors else {}
    result = end.result if end is not None and outcome == SUCCEEDED else None
    return Ran(
        job.id, job.task, job.args, job.attempt, outcome, result=result,
        error=error.get("error"), traceback=error.get("traceback"),
    )  # fmt: skip
