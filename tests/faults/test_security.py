"""Least privilege and secrets: the worker role does DML on forklift's tables and nothing
more; DSN passwords appear in no log, error, process title or /metrics."""

from __future__ import annotations

import secrets
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from forklift import _db
from forklift.embedded import Cluster
from forklift.supervisor.store import SupervisorStore
from forklift.testing import process_title, wait_for
from tests.faults.harness import Fleet, Workload

SECRET = "s3cr3t-" + secrets.token_hex(4)

# The setup the README documents (section "Running with least privilege"), with this
# test's own role and schema names. {owner}, {worker}, {schema} are filled in.
ROLES = """
CREATE ROLE {owner} LOGIN PASSWORD '{password}';
CREATE ROLE {worker} LOGIN PASSWORD '{password}';
GRANT CREATE ON DATABASE postgres TO {owner};
"""
GRANTS = """
GRANT USAGE ON SCHEMA {schema} TO {worker};
GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {schema} TO {worker};
GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {schema} TO {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema}
    GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {worker};
ALTER DEFAULT PRIVILEGES FOR ROLE {owner} IN SCHEMA {schema}
    GRANT USAGE, SELECT ON SEQUENCES TO {worker};
"""


def as_role(cluster: Cluster, role: str, password: str = SECRET) -> str:
    return f"postgresql://{role}:{password}@127.0.0.1:{cluster.port}/postgres"


class Roles:
    """An owner and a worker role, created on the cluster and dropped after."""

    def __init__(self, cluster: Cluster) -> None:
        tag = secrets.token_hex(3)
        self.cluster = cluster
        self.owner, self.worker = f"fl_owner_{tag}", f"fl_worker_{tag}"
        self.schema = f"fl_{tag}"
        self.names = {"owner": self.owner, "worker": self.worker, "schema": self.schema}
        with psycopg.connect(cluster.dsn, autocommit=True) as db:
            db.execute(ROLES.format(password=SECRET, **self.names))

    def drop(self) -> None:
        with psycopg.connect(self.cluster.dsn, autocommit=True) as db:
            db.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
            for role in (self.worker, self.owner):
                db.execute(f"DROP OWNED BY {role}")
                db.execute(f"DROP ROLE {role}")


@pytest.fixture
def roles(cluster: Cluster) -> Iterator[Roles]:
    made = Roles(cluster)
    yield made
    made.drop()


def forklift(*args: str, dsn: str, schema: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "forklift", *args, "--dsn", dsn, "--schema", schema],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_worker_role_runs_jobs_and_can_change_no_schema(
    cluster: Cluster, roles: Roles, tmp_path: Path
) -> None:
    owner_dsn, worker_dsn = as_role(cluster, roles.owner), as_role(cluster, roles.worker)
    migrated = forklift("migrate", dsn=owner_dsn, schema=roles.schema)
    assert migrated.returncode == 0, migrated.stderr
    with psycopg.connect(owner_dsn, autocommit=True) as db:  # the app's own table, its grant
        db.execute(
            f"CREATE TABLE {roles.schema}.effects (key text NOT NULL, job_id bigint,"
            " attempt integer, at timestamptz NOT NULL DEFAULT clock_timestamp())"
        )
        db.execute(GRANTS.format(**roles.names))
    producer = Workload(worker_dsn, roles.schema)  # the worker role enqueues too
    producer.enqueue(30, pause=0.01)
    fleet = Fleet.for_workload(producer, tmp_path, ["--workers", "2", "--lease", "30s"])
    try:
        (sup,) = fleet.start()
        producer.wait_finished(timeout=60, check=[sup])
        assert producer.verdict().problems == []
        assert "InsufficientPrivilege" not in sup.output()
        assert "sessions_end_failed" not in sup.output()
        # It may not VACUUM the jobs table: maintenance says so once and leaves it to
        # autovacuum, and fails at nothing.
        wait_for(lambda: "maintenance.no_vacuum" in sup.output(), what="maintenance's word")
        assert "maintenance.failed" not in sup.output()
    finally:
        fleet.kill()
        producer.app.close()
    with psycopg.connect(worker_dsn, autocommit=True) as db:
        for ddl in (
            f"ALTER TABLE {roles.schema}.jobs ADD COLUMN sneaky integer",
            f"DROP TABLE {roles.schema}.jobs",
            f"CREATE TABLE {roles.schema}.sneaky (x integer)",
            f"TRUNCATE {roles.schema}.jobs",
            f"DROP SCHEMA {roles.schema} CASCADE",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                db.execute(ddl)


def test_the_supervisor_ends_sessions_of_its_own_role_only(cluster: Cluster, roles: Roles) -> None:
    # A role may signal its own backends (pg_terminate_backend); the supervisor's query
    # keeps to those, so a least-privilege supervisor never errors on someone else's.
    worker_dsn = as_role(cluster, roles.worker)
    name = "forklift-worker:4242:abcdef"
    store = SupervisorStore(worker_dsn, roles.schema, _db.Timeouts())
    with (
        psycopg.connect(worker_dsn, application_name=name) as own,
        psycopg.connect(cluster.dsn, application_name=name) as superuser,
    ):
        assert store.backend_terminate(name) == 1
        with pytest.raises(psycopg.OperationalError):
            own.execute("SELECT 1")
        assert superuser.execute("SELECT 1").fetchone() == (1,)  # not its to end


def test_no_password_in_logs_errors_titles_or_metrics(
    cluster: Cluster, workload: Workload, tmp_path: Path
) -> None:
    with psycopg.connect(cluster.dsn, autocommit=True) as db:
        db.execute("ALTER ROLE postgres PASSWORD %s" % psycopg.sql.quote(SECRET))  # noqa: UP031
    secret_dsn = as_role(cluster, "postgres")
    workload.enqueue(20, pause=0.01)
    # On the command line (what `ps` shows until the title is set) and in the environment.
    fleet = Fleet.for_workload(workload, tmp_path, ["--workers", "2", "--dsn", secret_dsn])
    fleet.env["FORKLIFT_DATABASE_URL"] = secret_dsn
    (sup,) = fleet.start()
    try:
        workload.wait_finished(timeout=60, check=[sup])
        titles = [process_title(pid) for pid in [sup.pid, *sup.workers()]]
        assert titles and all(t.startswith("forklift ") for t in titles), titles
        assert not any(SECRET in t for t in titles)
        status, metrics = sup.get("/metrics")
        assert status == 200 and "forklift_jobs_total" in metrics and SECRET not in metrics
        cluster.stop("fast")  # errors get logged: none may carry it
        wait_for(lambda: sup.get("/readyz")[0] == 503, 20, 0.1, "not ready")
        cluster.start()
        wait_for(sup.ready, 20, 0.1, "ready again")
        sup.signal(signal.SIGTERM)
        assert sup.wait(timeout=30) == 0
    finally:
        fleet.kill()
        with psycopg.connect(cluster.dsn, autocommit=True) as db:
            db.execute("ALTER ROLE postgres PASSWORD NULL")
    assert "database_unreachable" in sup.output()
    assert SECRET not in sup.output()
    for args in (["status"], ["ps"], ["migrate"]):  # a bad database, an error on stderr
        bad = subprocess.run(
            [sys.executable, "-m", "forklift", *args, "--dsn",
             f"postgresql://u:{SECRET}@127.0.0.1:{cluster.port}/nodb"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert bad.returncode != 0 and "error" in bad.stderr
        assert SECRET not in bad.stdout + bad.stderr, args
