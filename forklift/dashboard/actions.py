"""The dashboard's actions, registered only with --allow-actions: retry (or retry from
scratch), cancel, pause, resume, purge, cancel a batch or a workflow. Each is a POST
behind the login and the CSRF token (see security.py), done through forklift.admin's
stores as the CLI does them, recorded as by `dashboard:NAME@ADDRESS` (in the job's error
history, as `jobs retry` records its operator), and logged as one `dashboard.action`
event with who, what and the outcome."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable

from flask import Flask, Response, abort, flash, redirect, request

from forklift._config import duration
from forklift._events import emit
from forklift.dashboard import security
from forklift.dashboard.reader import Reader
from forklift.errors import ArgumentError
from forklift.shown import batchview, jobview, output, workflowview

log = logging.getLogger(__name__)

PURGE_BATCHES = 100  # a purge from the dashboard deletes at most 100 x 500 jobs a click
PURGEABLE = ("succeeded", "dead", "cancelled")


def register(app: Flask, reader: Reader) -> None:
    def done(action: str, message: str, **fields: object) -> Response:
        emit(log, "dashboard.action", logging.INFO, who=security.who(), action=action,
             **fields, result=message)  # fmt: skip
        flash(message)
        return redirect(security.safe_next(request.form.get("next")), 303)  # type: ignore[return-value]

    @app.post("/actions/retry", endpoint="retry")
    def retry() -> Response:
        job_id = _job_id()
        scratch = request.form.get("from_scratch") == "1"  # the job page's second button
        [acted] = reader.jobs.job_retry_many([job_id], by=security.who(), from_scratch=scratch)
        message = jobview.retry_line(acted) + acted.checkpoint_note
        return done("retry", message, job=job_id, from_scratch=scratch)

    @app.post("/actions/cancel", endpoint="cancel")
    def cancel() -> Response:
        job_id = _job_id()
        [acted] = reader.jobs.job_cancel_many([job_id], by=security.who())
        return done("cancel", jobview.cancel_line(acted), job=job_id)

    @app.post("/actions/pause", endpoint="pause")
    def pause() -> Response:
        queue = _queue()
        paused = reader.admin.queue_pause(queue, by=security.who())
        what = "paused" if paused else "was paused already"
        return done("pause", f"queue {queue}: {what}", queue=queue)

    @app.post("/actions/resume", endpoint="resume")
    def resume() -> Response:
        queue = _queue()
        resumed = reader.admin.queue_resume(queue)
        what = "resumed" if resumed else "was not paused"
        return done("resume", f"queue {queue}: {what}", queue=queue)

    @app.post("/actions/purge", endpoint="purge")
    def purge() -> Response:
        state = request.form.get("state", "")
        if state not in PURGEABLE:
            abort(400, f"state must be one of {', '.join(PURGEABLE)}")
        try:
            older = duration(request.form.get("older_than", ""))
        except argparse.ArgumentTypeError as exc:
            abort(400, f"older than: {exc}")
        gone = reader.jobs.job_purge(state, older, dry_run=False, max_batches=PURGE_BATCHES)
        message = (
            f"purged {output.plural(gone.jobs, f'{state} job')} completed before "
            f"{output.utc(gone.cutoff)}"
        )
        if gone.more:
            message += f" (stopped after {gone.jobs}: purge again for more)"
        return done("purge", message, state=state, older_than=older, jobs=gone.jobs)

    @app.post("/actions/cancel-batch", endpoint="cancel_batch")
    def cancel_batch() -> Response:
        batch_id = _int("batch")
        gone = reader.batches.batch_cancel(batch_id, by=security.who())
        return done("cancel_batch", batchview.cancel_text(batch_id, gone), batch=batch_id)

    workflow_actions(app, reader, done)


def workflow_actions(app: Flask, reader: Reader, done: Callable[..., Response]) -> None:
    """Cancel a workflow: its blocked, ready and running steps (`workflows cancel`)."""

    @app.post("/actions/cancel-workflow", endpoint="cancel_workflow")
    def cancel_workflow() -> Response:
        workflow_id = _int("workflow")
        gone = reader.workflow_cancel(workflow_id, by=security.who())
        if gone is None:
            abort(404, f"no workflow {workflow_id} in schema {reader.schema}")
        message = workflowview.cancel_text(workflow_id, gone)
        return done("cancel_workflow", message, workflow=workflow_id)


def _int(name: str) -> int:
    text = request.form.get(name, "")
    if not text.isdigit() or len(text) > 19:
        abort(400, f"{name} must be an id")
    return int(text)


def _job_id() -> int:
    return _int("job")


def _queue() -> str:
    from forklift.admin import checked_queue

    try:
        return checked_queue(request.form.get("queue", ""))
    except ArgumentError as exc:
        abort(400, str(exc))
