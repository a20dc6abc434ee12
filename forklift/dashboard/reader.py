"""What each page of the dashboard reads, through forklift.admin's stores only, each page
in one database session (one pooled connection), and nothing else: the pages hold no
data of their own."""

from __future__ import annotations

from dataclasses import dataclass

from forklift import _db
from forklift.admin import AdminStore, Connector, JobAdmin, ProcessRow, QueueStats
from forklift.admin.batches import BatchAdmin, BatchDetail, BatchSummary
from forklift.admin.rows import DeadJob, FinishedMinute, JobDetail, JobFilter, JobPage
from forklift.scheduler.store import ScheduleRow
from forklift.shown import workflowview
from forklift.shown.processes import Listed, listed
from forklift.store.workflows import StepRow, WorkflowRow, WorkflowStore

DEAD_SHOWN = 10  # the latest dead jobs on the overview
CHART_MINUTES = 60  # the overview's charts: done and dead per minute, the last hour
BATCHES_SHOWN = 25  # open batches, and as many finished ones, on /batches
WORKFLOWS_SHOWN = 50  # the latest workflows on /workflows
# Jobs /jobs looks through for its filters per page (newest first, through an index): a
# page's cost stays bounded whatever the table holds; a short page offers to look on.
LIST_WINDOW = 20_000
PAGE = 50  # jobs per page


@dataclass(frozen=True)
class Overview:
    """The overview's live part: queues, who runs what, the latest dead jobs."""

    queues: list[QueueStats]
    processes: list[Listed]
    dead: list[DeadJob]


@dataclass(frozen=True)
class Processes:
    """Every registered process and what it runs, and which queues are paused."""

    lines: list[Listed]
    paused: set[str]


class Reader:
    """The dashboard's one door to the database: forklift.admin's stores on the pool's
    connections (`connector`), a session per page."""

    def __init__(self, dsn: str, schema: str, connector: Connector) -> None:
        self.connector = connector
        self.schema = schema
        self.where = f"{_db.describe(dsn)} schema {schema}"
        self.admin = AdminStore(dsn, schema, connector.timeouts, connector)
        self.jobs = JobAdmin(dsn, schema, connector)
        self.batches = BatchAdmin(dsn, schema, connector)
        self.workflows = WorkflowStore(lambda: connector.conn("workflow query failed"), schema)

    def overview(self) -> Overview:
        with self.connector.session("reading the overview failed"):
            running = self.jobs.job_running_list()
            return Overview(
                self.admin.queue_stats(hour=False),
                listed(self.admin.process_list(), running),
                self.jobs.job_dead_recent(DEAD_SHOWN),
            )

    def chart(self) -> list[FinishedMinute]:
        return self.jobs.job_finished_per_minute(CHART_MINUTES)

    def job_list(self, where: JobFilter, before: int | None) -> JobPage:
        return self.jobs.job_list(where, limit=PAGE, before=before, window=LIST_WINDOW)

    def job(self, job_id: int) -> JobDetail:
        return self.jobs.job_get(job_id)

    # Batches are tallied (not counted job by job): a batch of 200,000 costs what one of
    # 20 does, each second it is on screen.
    def batch_list(self) -> tuple[list[BatchSummary], list[BatchSummary]]:
        return self.batches.batch_list(BATCHES_SHOWN, exact=False)

    def batch(self, batch_id: int) -> BatchDetail:
        return self.batches.batch_get(batch_id, exact=False)

    def workflow_list(self) -> list[WorkflowRow]:
        return self.workflows.recent(WORKFLOWS_SHOWN)

    def workflow(self, workflow_id: int) -> tuple[WorkflowRow, list[StepRow]] | None:
        """The workflow and the steps its page draws (the first SHOWN); None: none."""
        with self.connector.session("reading the workflow failed"):
            row = self.workflows.get(workflow_id)
            if row is None:
                return None
            return row, self.workflows.steps(workflow_id, limit=workflowview.SHOWN)

    def workflow_cancel(self, workflow_id: int, by: str) -> workflowview.Cancelled | None:
        with self.connector.session("cancelling the workflow failed"):
            return workflowview.cancel(self.workflows, self.jobs.batches, workflow_id, by)

    def schedules(self) -> list[ScheduleRow]:
        return self.admin.schedule_list()

    def processes(self) -> Processes:
        with self.connector.session("reading the processes failed"):
            running = self.jobs.job_running_list()
            procs: list[ProcessRow] = self.admin.process_list()
            paused = {q.queue for q in self.admin.queue_paused_list()}
        return Processes(listed(procs, running), paused)
