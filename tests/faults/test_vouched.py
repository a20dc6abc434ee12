"""Liveness vouches, on real processes against the private cluster: an outage longer than
the lease charges no live worker, and a supervisor's children claim only while its
liveness lock is held, stopping within a second of its loss."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import forklift
from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.acceptance.proxy import Proxy
from tests.faults import sleepers
from tests.faults.harness import Fleet, Workload


@pytest.fixture
def runs_log(tmp_path: Path) -> Path:
    return tmp_path / "runs.log"


def sleepers_fleet(
    workload: Workload, tmp_path: Path, args: list[str], runs_log: Path, dsn: str
) -> Fleet:
    logdir = tmp_path / f"fleet-{len(list(tmp_path.glob('fleet-*')))}"  # one per fleet
    logdir.mkdir()
    fleet = Fleet.for_workload(workload, logdir, args, dsn, app="tests.faults.sleepers:app")
    fleet.env[sleepers.LOG_ENV] = str(runs_log)
    return fleet


@pytest.fixture
def producer(workload: Workload) -> Iterator[forklift.App]:
    app = forklift.App(workload.dsn, schema=workload.schema)
    yield app
    app.close()


def states(workload: Workload) -> dict[str, int]:
    rows = workload.scalar(
        "SELECT json_object_agg(state, n) FROM"
        " (SELECT state::text, count(*) AS n FROM {s}.jobs GROUP BY state) AS s"
    )
    return dict(rows or {})


def test_an_outage_longer_than_the_lease_charges_no_live_worker(
    cluster: Cluster, workload: Workload, producer: forklift.App, tmp_path: Path, runs_log: Path
) -> None:
    # Three 20 s jobs, each on a worker of its own, and an idle worker beside them; the
    # database stops for 12 s, twice the lease. Each worker is alive throughout: its job
    # must run once, to its end, and succeed; none re-run beside it, none dead.
    args = ["--workers", "4", "--lease", "6s", "--grace", "5s"]
    fleet = sleepers_fleet(workload, tmp_path, args, runs_log, workload.dsn)
    try:
        fleet.start()
        fleet.wait_ready()
        specs = [
            forklift.JobSpec("sleeper", {"key": f"k{i}", "seconds": 20.0}, max_attempts=n)
            for i, n in enumerate([3, 3, 1])
        ]
        producer.enqueue_many(specs)
        wait_for(lambda: len(sleepers.runs(runs_log)) == 3, 20, 0.05, "three handlers running")
        cluster.stop("fast")
        time.sleep(12.0)
        cluster.start()
        wait_for(lambda: workload.unfinished() == 0, 60, 0.2, "every job finished")
        found = sleepers.runs(runs_log)
        twice = sleepers.overlapping(found)
        dead = workload.scalar(
            "SELECT array_agg(args->>'key' ORDER BY id) FROM {s}.jobs WHERE state = 'dead'"
        )
        assert (twice, dead) == ([], None), (found, states(workload), fleet.output()[-3000:])
        assert states(workload) == {"succeeded": 3}
        assert sorted((r.key, r.attempt) for r in found) == [("k0", 1), ("k1", 1), ("k2", 1)]
        fleet.check_alive()
    finally:
        fleet.kill()


@pytest.mark.parametrize("outage", ["restart", "network"])
def test_after_an_outage_a_peer_waits_for_owners_whose_locks_come_back_late(
    outage: str,
    cluster: Cluster,
    workload: Workload,
    proxy: Proxy,
    producer: forklift.App,
    tmp_path: Path,
    runs_log: Path,
) -> None:
    # Supervisor A runs three 20 s jobs; B, idle beside it, is back the moment the
    # outage ends (the server restarted, or the network healed), A's session (its
    # liveness lock) 0.6 s later, within a peer's second sighting (supervisor/deaths.py):
    # A's workers are alive all along, and a peer back first must not take their
    # expired leases.
    args = ["--lease", "6s", "--grace", "5s"]
    network = Proxy.to(cluster.dsn)  # everything but A's session: the workers' network
    a = sleepers_fleet(
        workload, tmp_path, ["--workers", "3", *args], runs_log, network.dsn_through(workload.dsn)
    )
    a.env["FORKLIFT_SESSION_DATABASE_URL"] = proxy.dsn_through(workload.dsn)
    b = sleepers_fleet(
        workload, tmp_path, ["--workers", "2", *args], runs_log, network.dsn_through(workload.dsn)
    )
    try:
        a.start()
        a.wait_ready()
        specs = [forklift.JobSpec("sleeper", {"key": f"k{i}", "seconds": 20.0}, max_attempts=n)
                 for i, n in enumerate([3, 3, 1])]  # fmt: skip
        producer.enqueue_many(specs)
        wait_for(lambda: len(sleepers.runs(runs_log)) == 3, 20, 0.05, "three handlers running")
        b.start()
        b.wait_ready()
        proxy.cut()
        if outage == "restart":
            cluster.stop("fast")
            time.sleep(9.0)
            cluster.start()
        else:
            network.cut()
            time.sleep(9.0)
            network.restore()
        time.sleep(0.6)
        proxy.restore()
        wait_for(lambda: workload.unfinished() == 0, 60, 0.2, "every job finished")
        found = sleepers.runs(runs_log)
        twice = sleepers.overlapping(found)
        dead = workload.scalar(
            "SELECT array_agg(args->>'key' ORDER BY id) FROM {s}.jobs WHERE state = 'dead'"
        )
        assert (twice, dead) == ([], None), (found, states(workload), a.output()[-4000:])
        assert states(workload) == {"succeeded": 3}
        a.check_alive()
        b.check_alive()
    finally:
        proxy.restore()
        network.cut()
        a.kill()
        b.kill()


def claimed_since(workload: Workload, since: object) -> int:
    return int(workload.scalar("SELECT count(*) FROM {s}.jobs WHERE started_at > %s", since) or 0)


def test_children_claim_only_while_their_supervisors_lock_is_held(
    workload: Workload, proxy: Proxy, producer: forklift.App, tmp_path: Path, runs_log: Path
) -> None:
    # The children's connections go straight to the database; the supervisor's session
    # (its liveness lock) goes through a proxy the test cuts: "too many clients" on its
    # reconnect, or a slow connect at boot, while the children's connections work.
    args = ["--workers", "2", "--lease", "30s"]
    fleet = sleepers_fleet(workload, tmp_path, args, runs_log, workload.dsn)
    fleet.env["FORKLIFT_SESSION_DATABASE_URL"] = proxy.dsn_through(workload.dsn)
    producer.enqueue_many(
        [forklift.JobSpec("sleeper", {"key": f"k{i}", "seconds": 0.05}) for i in range(3000)]
    )
    proxy.cut()
    try:
        (sup,) = fleet.start()
        booted = "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
        wait_for(lambda: len(sup.workers()) == 2, 20, 0.05, "two children")
        wait_for(
            lambda: (workload.scalar(booted, "forklift-worker:%") or 0) >= 2,
            20,
            0.05,
            "the children's own connections",
        )
        time.sleep(2.0)  # what a child claims unvouched, it claims at once
        assert states(workload) == {"ready": 3000}

        # Its session connects: the children start within a second of the lock.
        proxy.restore()
        restored = time.monotonic()
        wait_for(lambda: claimed_since(workload, "-infinity") > 0, 10, 0.01, "a claim")
        assert time.monotonic() - restored < 1.5

        # Its session is cut: they stop claiming within a second.
        wait_for(lambda: claimed_since(workload, "-infinity") > 50, 20, 0.05, "work under way")
        proxy.cut()
        cut_at = workload.scalar("SELECT clock_timestamp()")
        time.sleep(3.0)
        late = workload.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE started_at > %s::timestamptz + interval '1 s'",
            cut_at,
        )
        assert late == 0, fleet.output()[-3000:]
        assert (workload.unfinished() or 0) > 0  # there was work left to claim
        fleet.check_alive()
    finally:
        proxy.restore()
        fleet.kill()
