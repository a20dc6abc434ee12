"""Fault-test fixtures: one private PostgreSQL cluster for the session, a proxy in front of
it, and per test a workload schema and a fleet of supervisors (killed at teardown)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from forklift.embedded import Cluster
from tests.acceptance.proxy import Proxy
from tests.faults.harness import Fleet, Workload
from tests.faults.injector import Injector


def _accepting(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=2):
            return True
    except psycopg.OperationalError:
        return False


@pytest.fixture(scope="session")
def session_cluster() -> Iterator[Cluster]:
    with Cluster(prefix="forklift-faults-") as cluster:
        yield cluster


@pytest.fixture
def cluster(session_cluster: Cluster) -> Cluster:
    """The session's private cluster, running (a test before may have left it stopped)."""
    if not _accepting(session_cluster.dsn):
        session_cluster.start()
    return session_cluster


@pytest.fixture
def proxy(cluster: Cluster) -> Iterator[Proxy]:
    proxy = Proxy.to(cluster.dsn)
    yield proxy
    proxy.cut()


@pytest.fixture
def workload(cluster: Cluster) -> Iterator[Workload]:
    workload = Workload(cluster.dsn)
    workload.create()
    yield workload
    if not _accepting(cluster.dsn):
        cluster.start()
    workload.drop()


@pytest.fixture
def fleet_args() -> list[str]:
    """`forklift run` flags of the fleet; a test may override this fixture."""
    return ["--workers", "2", "--lease", "3s", "--grace", "5s"]


@pytest.fixture
def fleet(
    workload: Workload, proxy: Proxy, tmp_path: Path, fleet_args: list[str]
) -> Iterator[Fleet]:
    """Supervisors of the workload app, connected through the proxy (none started yet)."""
    fleet = Fleet.for_workload(workload, tmp_path, fleet_args, proxy.dsn_through(workload.dsn))
    yield fleet
    fleet.kill()


@pytest.fixture
def injector(cluster: Cluster, proxy: Proxy, fleet: Fleet, workload: Workload) -> Injector:
    return Injector(cluster, proxy, fleet, workload, lease=3.0, outage=5.0)
