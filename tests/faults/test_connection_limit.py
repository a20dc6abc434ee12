"""A database that takes no more connections (the role's CONNECTION LIMIT reached, as with
max_connections): the supervisor and its workers go on with the connections they hold,
no live job is charged, and readiness says why, once in a while rather than every round."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.faults.harness import Fleet, Workload
from tests.faults.test_security import GRANTS, Roles, as_role


@pytest.fixture
def roles(cluster: Cluster) -> Iterator[Roles]:
    made = Roles(cluster)
    yield made
    made.drop()


def test_work_goes_on_when_the_database_refuses_new_connections(
    cluster: Cluster, roles: Roles, tmp_path: Path
) -> None:
    owner_dsn, worker_dsn = as_role(cluster, roles.owner), as_role(cluster, roles.worker)
    setup = Workload(owner_dsn, roles.schema)
    setup.create()
    with psycopg.connect(cluster.dsn, autocommit=True) as admin:
        admin.execute(GRANTS.format(**roles.names))
        fleet = Fleet.for_workload(setup, tmp_path, ["--workers", "2"], dsn=worker_dsn)
        try:
            (sup,) = fleet.start()
            fleet.wait_ready()
            # The supervisor's connection that holds no advisory lock (the other one,
            # its session, holds its liveness lock).
            statements = (
                "SELECT a.pid FROM pg_stat_activity AS a WHERE a.usename = %s"
                " AND a.application_name = 'forklift-supervisor' AND NOT EXISTS ("
                " SELECT 1 FROM pg_locks AS l WHERE l.pid = a.pid AND l.locktype = 'advisory')"
            )
            # N + 2: the two workers' connections and the supervisor's two; plus one for
            # maintenance, on the replica that maintains (this one).
            count = f"SELECT count(*) FROM pg_stat_activity WHERE usename = '{roles.worker}'"
            wait_for(lambda: admin.execute(count).fetchone() == (5,), what="N + 3 connections")
            # The handlers' effect connections come on top, opened when first needed.
            setup.enqueue(10, spins=1000)
            setup.wait_finished(timeout=30, check=[sup])
            (held,) = admin.execute(count).fetchone() or (0,)
            assert 6 <= held <= 7
            admin.execute(f'ALTER ROLE "{roles.worker}" CONNECTION LIMIT {held - 1}')
            # The supervisor's own statements' connection goes; it may not come back.
            own = [pid for (pid,) in admin.execute(statements, (roles.worker,))]
            assert len(own) == 1
            admin.execute("SELECT pg_terminate_backend(%s)", (own[0],))
            wait_for(
                lambda: sup.get("/readyz")[0] == 503 and "refuses new" in sup.get("/readyz")[1],
                timeout=10,
                what="not ready, saying why",
            )
            setup.enqueue(40, spins=1000)
            setup.wait_finished(timeout=30, check=[sup])
            verdict = setup.verdict()
            assert verdict.problems == [] and verdict.max_attempts_used == 1
            assert verdict.succeeded == 50
            charged = setup.scalar("SELECT count(*) FROM {s}.jobs WHERE crashes > 0")
            assert charged == 0
            said = re.findall(r"supervisor\.database_unreachable", sup.output())
            assert 1 <= len(said) <= 2, said  # once, not once a round
            failed = re.findall(r"WARNING \S+ \w+\.failed", sup.output())
            assert len(failed) <= 2, failed  # the database thread's services: once for all
            admin.execute(f'ALTER ROLE "{roles.worker}" CONNECTION LIMIT -1')
            wait_for(lambda: sup.ready(), timeout=10, what="ready again")
        finally:
            fleet.kill()
            setup.app.close()
