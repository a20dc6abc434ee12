"""The dashboard's pages, each a view over `Reader` with a `/live/...` twin that renders
only the part the browser refreshes (the same template, included by the page)."""

from __future__ import annotations

from collections.abc import Callable

from flask import Flask, abort, render_template, request, url_for

from forklift.admin.rows import JobFilter
from forklift.dashboard import charts, graph, views
from forklift.dashboard.reader import LIST_WINDOW, PAGE, Reader
from forklift.shown import workflowview
from forklift.shown.jobview import STATES
from forklift.shown.schedules import DECLARED_WITHIN, as_json

FILTER_CHARS = 200  # the longest filter value a /jobs query may carry


def register(app: Flask, reader: Reader) -> None:
    def page(rule: str, name: str, view: Callable[..., str]) -> None:
        """`rule` for the page, `/live` + `rule` for its live part."""
        app.add_url_rule(rule, name, view, defaults={"live": False})
        app.add_url_rule(f"/live{rule}", f"{name}_live", view, defaults={"live": True})

    def overview(live: bool) -> str:
        data = reader.overview()
        if live:
            return render_template("_overview.html", o=data)
        return render_template(
            "overview.html", o=data, charts=charts.charts(reader.chart()), page="overview"
        )

    def chart() -> str:
        return render_template("_charts.html", charts=charts.charts(reader.chart()))

    def job(job_id: int, live: bool) -> str:
        view = views.job_view(reader.job(job_id))
        return render_template("_job.html" if live else "job.html", v=view, page="jobs")

    def batches(live: bool) -> str:
        open_, finished = reader.batch_list()
        return render_template(
            "_batches.html" if live else "batches.html", open=open_, finished=finished,
            views=views, page="batches",
        )  # fmt: skip

    def batch(batch_id: int, live: bool) -> str:
        d = reader.batch(batch_id)
        return render_template(
            "_batch.html" if live else "batch.html", d=d, s=d.summary, views=views,
            page="batches",
        )  # fmt: skip

    def schedules(live: bool) -> str:
        rows = [(r, as_json(r)) for r in reader.schedules()]
        return render_template(
            "_schedules.html" if live else "schedules.html", rows=rows,
            declared_within=DECLARED_WITHIN, page="schedules",
        )  # fmt: skip

    def processes(live: bool) -> str:
        data = reader.processes()
        return render_template(
            "_processes.html" if live else "processes.html", p=data, page="processes"
        )

    page("/", "overview", overview)
    app.add_url_rule("/live/charts", "charts", chart)
    page("/jobs", "jobs", lambda live: jobs(reader, live))
    page("/jobs/<int:job_id>", "job", job)
    page("/batches", "batches", batches)
    page("/batches/<int:batch_id>", "batch", batch)
    workflow_pages(reader, page)
    page("/schedules", "schedules", schedules)
    page("/processes", "processes", processes)


def workflow_pages(reader: Reader, page: Callable[[str, str, Callable[..., str]], None]) -> None:
    """/workflows, the latest; /workflows/ID, one with its graph (graph.py's SVG)."""

    def workflows(live: bool) -> str:
        return render_template(
            "_workflows.html" if live else "workflows.html", rows=reader.workflow_list(),
            wv=workflowview, page="workflows",
        )  # fmt: skip

    def workflow(workflow_id: int, live: bool) -> str:
        found = reader.workflow(workflow_id)
        if found is None:
            abort(404, f"no workflow {workflow_id} in schema {reader.schema}")
        shape = workflowview.layout(*found)
        return render_template(
            "_workflow.html" if live else "workflow.html", lay=shape, g=graph.graph(shape),
            wv=workflowview, colours=graph.COLOURS, page="workflows",
        )  # fmt: skip

    page("/workflows", "workflows", workflows)
    page("/workflows/<int:workflow_id>", "workflow", workflow)


def jobs(reader: Reader, live: bool) -> str:
    """/jobs: the filters of `jobs list`, newest first, a page at a time (keyset: the
    next page is the jobs older than the last one shown)."""
    wanted = _job_filter()  # not `where`: base.html's header names the database by it
    before = _int_arg("before")
    found = reader.job_list(wanted, before)
    args = {k: v for k, v in vars(wanted).items() if v is not None}
    older = None
    if found.next_before is not None:
        older = url_for("jobs", **args, before=found.next_before)
    return render_template(
        "_jobs.html" if live else "jobs.html", wanted=wanted, found=found,
        states=STATES, window=LIST_WINDOW, short=len(found.jobs) < PAGE,
        live_url=None if before is not None else url_for("jobs_live", **args),
        newest=None if before is None else url_for("jobs", **args), older=older,
        page="jobs",
    )  # fmt: skip


def _int_arg(name: str) -> int | None:
    text = request.args.get(name, "").strip()
    if not text:
        return None
    if not text.isdigit() or len(text) > 18:
        abort(400, f"{name} must be a job id")
    return int(text)


def _text_arg(name: str) -> str | None:
    text = request.args.get(name, "").strip()
    if len(text) > FILTER_CHARS:
        abort(400, f"{name} may be at most {FILTER_CHARS} characters")
    return text or None


def _job_filter() -> JobFilter:
    state = _text_arg("state")
    if state is not None and state not in STATES:
        abort(400, f"state must be one of {', '.join(STATES)}")
    return JobFilter(state, _text_arg("queue"), _text_arg("task"), _text_arg("error"))
