"""forklift behind Debian's PgBouncer, with server connections recycled every 3 s.

The workers' URL goes through the bouncer (transaction mode: any statement may reach
any backend; it refuses libpq's `options`), the session-level work through
FORKLIFT_SESSION_DATABASE_URL (direct here). Effects once each, no job charged while
its worker lives, deaths recovered as fast as without a bouncer, singletons exclusive.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import forklift
from forklift import _locks
from forklift.embedded import Cluster
from forklift.errors import ConfigError
from forklift.store.limits import LimitStore
from forklift.testing import wait_for
from tests.faults.bouncer import PgBouncer
from tests.faults.harness import REPO, Fleet, Workload
from tests.faults.test_recovery import running_on, seconds_until_rerun


@pytest.fixture(params=["transaction", "session"])
def bouncer(request: pytest.FixtureRequest, cluster: Cluster) -> Iterator[PgBouncer]:
    with PgBouncer(cluster.dsn, str(request.param), server_lifetime=3) as b:
        yield b


@pytest.fixture
def pooled_fleet(workload: Workload, bouncer: PgBouncer, tmp_path: Path) -> Iterator[Fleet]:
    args = ["--workers", "2", "--concurrency", "2", "--lease", "5s", "--grace", "5s"]
    # Transaction mode: session-level work straight to PostgreSQL (the flag). Session
    # mode: through the same bouncer, named as the session URL too (the variable).
    if bouncer.mode == "transaction":
        args += ["--session-dsn", workload.dsn]
    fleet = Fleet.for_workload(workload, tmp_path, args, dsn=bouncer.dsn)
    if bouncer.mode == "session":
        fleet.env["FORKLIFT_SESSION_DATABASE_URL"] = bouncer.dsn
    yield fleet
    fleet.kill()


def charged(workload: Workload) -> int:
    return int(workload.scalar("SELECT count(*) FROM {s}.jobs WHERE crashes > 0") or 0)


def test_a_thousand_jobs_commit_their_effects_once_and_none_is_charged(
    workload: Workload, pooled_fleet: Fleet
) -> None:
    workload.enqueue(1000, spins=2000)
    workload.enqueue(2, spins=1000, pause=8.0, tag="long")  # outlives server_lifetime twice
    pooled_fleet.start(2)
    workload.wait_finished(timeout=120, check=pooled_fleet.procs)
    verdict = workload.verdict()
    assert verdict.problems == []
    assert verdict.succeeded == 1002 and verdict.max_attempts_used == 1
    assert charged(workload) == 0
    output = pooled_fleet.output()
    for sign in ("does not exist", "WorkerLost", "liveness_lost", "unsupported startup"):
        assert sign not in output, sign


def test_a_killed_workers_job_runs_again_within_a_second(
    workload: Workload, pooled_fleet: Fleet
) -> None:
    workload.enqueue(1, spins=1000, pause=5.0)
    (sup,) = pooled_fleet.start()
    pooled_fleet.wait_ready()
    held = wait_for(lambda: running_on(workload, sup), 20, 0.05, "the job running")
    owner = workload.scalar("SELECT lease_owner FROM {s}.jobs WHERE id = %s", held[0])
    os.kill(int(owner.split(":")[1]), signal.SIGKILL)
    took = seconds_until_rerun(workload, held)
    print(f"SIGKILLed worker's job running again after {took:.3f} s")
    assert took < 1.0


def test_a_killed_supervisor_groups_jobs_run_again_on_a_peer_within_two_seconds(
    workload: Workload, pooled_fleet: Fleet
) -> None:
    workload.enqueue(2, spins=1000, pause=5.0)
    (doomed,) = pooled_fleet.start()
    pooled_fleet.wait_ready()
    held = wait_for(lambda: len(i := running_on(workload, doomed)) == 2 and i, 20, 0.05)
    pooled_fleet.start()
    pooled_fleet.wait_ready()
    doomed.kill_group()
    took = seconds_until_rerun(workload, held)
    print(f"killed supervisor group's jobs running again after {took:.3f} s")
    assert took < 2.0


def test_a_supervisor_through_a_transaction_pooler_alone_refuses_to_start(
    workload: Workload, bouncer: PgBouncer
) -> None:
    if bouncer.mode != "transaction":
        pytest.skip("a session-mode pooler keeps sessions: the refusal is for transaction mode")
    env = dict(os.environ, FORKLIFT_DATABASE_URL=bouncer.dsn, FORKLIFT_SCHEMA=workload.schema)
    env.pop("FORKLIFT_SESSION_DATABASE_URL", None)
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "forklift", "run", "tests.faults.workload:app"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr  # a configuration error
    assert "FORKLIFT_SESSION_DATABASE_URL" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_singletons_stay_exclusive_and_need_a_session(
    workload: Workload, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = forklift.App(bouncer.dsn, schema=workload.schema)
    monkeypatch.delenv("FORKLIFT_SESSION_DATABASE_URL", raising=False)
    refused = pytest.raises(ConfigError, match="FORKLIFT_SESSION_DATABASE_URL")
    with refused, app.singleton("x"):
        pass
    direct = workload.dsn if bouncer.mode == "transaction" else bouncer.dsn
    monkeypatch.setenv("FORKLIFT_SESSION_DATABASE_URL", direct)
    inside = 0
    most = 0
    lock = threading.Lock()
    errors: list[BaseException] = []

    def contend() -> None:
        nonlocal inside, most
        try:
            for _ in range(20):
                with app.singleton("x") as mine:
                    if mine:
                        with lock:
                            inside += 1
                            most = max(most, inside)
                        threading.Event().wait(0.005)
                        with lock:
                            inside -= 1
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=contend) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == [] and most == 1
    with psycopg.connect(workload.dsn, autocommit=True) as db:  # no lock left behind
        assert _locks.held_by_anyone(db, [f"singleton:{workload.schema}:x"]) == set()
    app.close()


def test_a_claim_under_limits_holds_through_the_pooler(
    workload: Workload, bouncer: PgBouncer
) -> None:
    """The limited claim is a pipelined transaction (lock, then claim in a fresh
    snapshot, a transaction-local setting between them): through a transaction pooler
    both statements reach the same backend, and four claimers at once never run more
    than the limit."""
    app = forklift.App(bouncer.dsn, schema=workload.schema)

    @app.task(limit=forklift.Limit(concurrency=2))
    def resize(ctx: forklift.JobContext, *, n: int) -> None: ...

    app.enqueue_many([("resize", {"n": i}) for i in range(100)])
    limits = LimitStore(app.store.pool, workload.schema, "pooled")
    limits.register({"resize": resize.limit})
    most = 0
    errors: list[BaseException] = []

    def claimer(owner: str) -> None:
        nonlocal most
        try:
            while workload.scalar("SELECT count(*) FROM {s}.jobs WHERE state <> 'succeeded'"):
                jobs, *_ = limits.claim(["default"], ["resize"], owner, 5, 30.0, expired=False)
                running = workload.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'running'")
                most = max(most, int(running))
                for job in jobs:
                    workload.scalar(
                        "UPDATE {s}.jobs SET state = 'succeeded', lease_owner = NULL"
                        " WHERE id = %s RETURNING id",
                        job.id,
                    )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    app.close()
    assert errors == []
    assert most <= 2
    assert workload.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'") == 100


def test_results_are_waited_for_through_the_pooler_with_or_without_a_session_url(
    workload: Workload, bouncer: PgBouncer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Waits read their job by short calls through the bouncer; their LISTEN goes to the
    session URL, or, with none beside a transaction pooler, nowhere (reads on a timer)."""
    from forklift import _waiting

    direct = workload.dsn if bouncer.mode == "transaction" else bouncer.dsn
    for session in (None, direct):
        if session is None:
            monkeypatch.delenv("FORKLIFT_SESSION_DATABASE_URL", raising=False)
        else:
            monkeypatch.setenv("FORKLIFT_SESSION_DATABASE_URL", session)
        app = forklift.App(bouncer.dsn, schema=workload.schema)
        job_id = app.enqueue("noop", queue="waited")

        def finish(job_id: int = job_id) -> None:
            with psycopg.connect(workload.dsn, autocommit=True) as db:
                db.execute(
                    f"UPDATE {workload.schema}.jobs SET state = 'succeeded', completed_at = now(),"
                    " result = '7' WHERE queue = 'waited' AND state = 'ready'"
                )
                db.execute(f"SELECT pg_notify('{workload.schema}_done', 'j' || %s)", (job_id,))

        timer = threading.Timer(1.0, finish)
        timer.start()
        assert app.result(job_id, timeout=30) == 7
        timer.join()
        if session is None and bouncer.mode == "transaction":
            deaf = functools.partial(getattr, _waiting.ends(bouncer.dsn), "deaf")
            wait_for(deaf, what="the waits' listener found the pooler")
        app.close()
