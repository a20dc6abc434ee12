"""What only the parent serves: the schedules, the probes behind /healthz, /readyz and
/metrics, the queue gauges and the progress reports. prometheus_client and the operator's
store are behind them: the supervisor imports this module after its first fork
(arbiter.py)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from forklift import _db
from forklift._conns import HeldConnection
from forklift.admin import AdminStore
from forklift.admin._connect import Connector
from forklift.app import App
from forklift.metrics import Totals
from forklift.scheduler.metrics import CronCollector
from forklift.scheduler.service import Scheduler
from forklift.scheduler.store import ScheduleStore
from forklift.store.workflows import WorkflowStore
from forklift.supervisor.config import SupervisorConfig
from forklift.supervisor.dbthread import PACED, DbService
from forklift.supervisor.http import Route, routes_for
from forklift.supervisor.probes import REFRESH_EVERY, Probes, metrics_registry
from forklift.supervisor.progress import ProgressReporter
from forklift.supervisor.snapshot import SnapshotBoard
from forklift.supervisor.workflow_gauges import WorkflowCollector

# Where the parent's statements go: DSN, schema, bounds, the database thread's connection.
Where = tuple[str, str, _db.Timeouts, HeldConnection]


@dataclass(frozen=True)
class Served:
    """The HTTP server's routes, the probes they read, the scheduler, and their rounds on
    the database thread (the probes' only when /metrics is served)."""

    routes: dict[str, Route]
    probes: Probes
    scheduler: Scheduler
    services: Sequence[DbService]


def serve(
    where: Where, app: App, config: SupervisorConfig, totals: Totals, board: SnapshotBoard
) -> Served:
    """The scheduler of `app`'s schedules, the probes and the progress reports on the
    operator's store, all over the held connection; /metrics sums the children's
    counters, the gauges and the schedules."""
    dsn, schema, timeouts, held = where
    queues = config.worker.queues
    scheduler = Scheduler(
        ScheduleStore(dsn, schema, timeouts, held), app.schedules.values(), config.scheduler
    )
    admin = AdminStore(dsn, schema, connector=Connector(dsn, timeouts, held))
    progress = ProgressReporter(totals, admin, queues)
    probes = Probes(board, admin, queues)
    services = [
        DbService("scheduler", config.scheduler.tick, scheduler.run_once),
        DbService("progress", progress.every, progress.run_once, share=PACED),
    ]
    if config.metrics_addr:
        services.append(DbService("probes", REFRESH_EVERY, probes.refresh))
        services.append(DbService("queue stats", REFRESH_EVERY, probes.refresh_stats, share=PACED))
    workflows = WorkflowStore(lambda: admin.connector.conn("reading workflows failed"), schema)
    metrics = metrics_registry(
        totals, probes, CronCollector(scheduler), WorkflowCollector(workflows)
    )
    return Served(routes_for(probes, metrics), probes, scheduler, services)
