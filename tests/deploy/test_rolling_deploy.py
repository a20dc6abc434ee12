"""A rolling deploy under load, as Kubernetes does it with deploy/kubernetes: three
supervisors share a database while a producer enqueues effect jobs at a steady rate; one
at a time, a fresh supervisor starts and, once ready, an old one gets SIGTERM (maxSurge
1, maxUnavailable 0). No job may be lost, no effect doubled, completions never stop for
a second, and every stop ends within the supervisor's shutdown budget.

Some jobs outlast --grace, so stops both let jobs finish and release them mid-handler;
the effects table has no unique constraint, so a double commit would show.
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from typing import Any

import psycopg

import forklift
from forklift.testing import WaitTimedOut, wait_for
from tests.acceptance.conftest import Proc, get, metrics_url
from tests.deploy.support import run_config

REPLICAS = 3
RATE = 10.0  # jobs enqueued per second
GRACE = 1.0
LONG = 3.0  # every sixth job runs this long: a stop past --grace releases it mid-handler
LONG_EVERY = 6
ARGS = ["run", "tests.apps.basic:app", "--workers", "3", "--grace", f"{GRACE}s"]


class Producer:
    """Enqueues effect jobs at RATE per second from a thread until stopped."""

    def __init__(self, app: forklift.App) -> None:
        self.app = app
        self.ids: list[int] = []
        self.long: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="producer", daemon=True)

    def __enter__(self) -> Producer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            n = len(self.ids)
            sleep = LONG if n % LONG_EVERY == 0 else 0.05 * (1 + n % 3)
            job_id = self.app.enqueue("effect", {"key": f"k{n}", "n": n, "sleep": sleep})
            self.ids.append(job_id)
            if sleep == LONG:
                self.long.add(job_id)
            self._stop.wait(max(0.0, started + (n + 1) / RATE - time.monotonic()))


def _ready(sup: Proc) -> Proc:
    url = metrics_url(sup)
    wait_for(lambda: get(f"{url}/readyz")[0] == 200, timeout=30, what="/readyz 200")
    return sup


def _db_now(db: psycopg.Connection[Any]) -> Any:
    row = db.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def _holds_a_long_job(db: psycopg.Connection[Any], schema: str, sup: Proc, long: set[int]) -> bool:
    """Whether one of `sup`'s workers runs a long job with more than --grace to go."""
    running = db.execute(
        f"SELECT id, lease_owner FROM {schema}.jobs WHERE state = 'running'"
        " AND started_at > now() - make_interval(secs => %s)",
        (LONG - GRACE - 0.5,),
    ).fetchall()
    workers = set(sup.children())
    return any(i in long and int(owner.split(":")[1]) in workers for i, owner in running)


def _roll(
    start: Any, replicas: list[Proc], holds_long: Any, timeout: float
) -> list[tuple[Proc, float]]:
    """Replace each replica: a new one up and ready first, then SIGTERM to the old one
    (preferably while it runs a job it will have to release). The old ones, with how
    long each took to stop."""
    stopped = []
    for i, old in enumerate(list(replicas)):
        replicas[i] = _ready(start(*ARGS))
        with contextlib.suppress(WaitTimedOut):
            wait_for(lambda: holds_long(old), timeout=6.0)  # noqa: B023
        stopped.append((old, old.stop_cleanly(timeout=timeout)))
    return stopped


def _completions_per_second(
    db: psycopg.Connection[Any], schema: str, since: Any, until: Any
) -> list[int]:
    """Jobs completed in each whole second from `since` to `until` (database clock)."""
    rows = db.execute(
        f"""SELECT count(j.id)
              FROM generate_series(%s::timestamptz, %s::timestamptz - interval '1 s',
                                   interval '1 s') AS s(at)
              LEFT JOIN {schema}.jobs j ON j.state = 'succeeded'
                   AND j.completed_at >= s.at AND j.completed_at < s.at + interval '1 s'
             GROUP BY s.at ORDER BY s.at""",
        (since, until),
    ).fetchall()
    return [n for (n,) in rows]


def _outcome(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> dict[str, int]:
    """Once every job had time to finish: how many never succeeded, how many succeeded
    jobs have no effect, and how many effects were committed twice."""
    succeeded = f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'"
    with contextlib.suppress(WaitTimedOut):
        wait_for(lambda: db.execute(succeeded).fetchone() == (len(ids),), timeout=30)
    done, effects, doubled = db.execute(
        f"""SELECT ({succeeded}),
                   (SELECT count(DISTINCT job_id) FROM {schema}.effects),
                   (SELECT count(*) FROM (SELECT job_id FROM {schema}.effects
                                           GROUP BY job_id HAVING count(*) > 1) d)"""
    ).fetchone() or (0, 0, 0)
    return {
        "jobs": len(ids),
        "lost": len(ids) - done,
        "no effect": done - effects,
        "doubled": doubled,
    }


def test_a_rolling_deploy_under_load_loses_nothing_and_doubles_nothing(
    dsn: str, schema: str, db: psycopg.Connection[Any], env: dict[str, str], forklift_cli: Any
) -> None:
    budget = run_config(ARGS, env).shutdown_budget  # as the supervisors will see it
    replicas = [forklift_cli(*ARGS) for _ in range(REPLICAS)]
    for sup in replicas:
        _ready(sup)
    app = forklift.App(dsn, schema=schema)
    with Producer(app) as producer:
        time.sleep(2.0)  # steady state before the roll
        rolled_at = _db_now(db)
        holds_long = functools.partial(_holds_a_long_job, db, schema, long=producer.long)
        stopped = _roll(forklift_cli, replicas, holds_long, timeout=budget + 10)
        rolled_until = _db_now(db)
    app.close()
    outcome = _outcome(db, schema, producer.ids)
    per_second = _completions_per_second(db, schema, rolled_at, rolled_until)
    stops = [seconds for _, seconds in stopped]
    released = sum(old.output().count("job.released") for old, _ in stopped)
    print(
        f"\nrolling deploy: {outcome}, completions/s during the roll: min {min(per_second)} "
        f"max {max(per_second)} over {len(per_second)} s; stops "
        + ", ".join(f"{s:.2f} s" for s in stops)
        + f" (budget {budget:.1f} s); jobs released by those stops: {released}"
    )
    assert outcome == {"jobs": len(producer.ids), "lost": 0, "no effect": 0, "doubled": 0}
    assert min(per_second) > 0, per_second
    assert all(s <= budget for s in stops), (stops, budget)
    assert released > 0, "no stop released a job: the test missed what it is for"
    for sup in replicas:
        assert sup.stop_cleanly(timeout=budget + 10) <= budget
