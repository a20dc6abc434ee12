"""Job cost in one worker: a task declared `cost=N` takes N of its worker's concurrency
slots, so the costs of the handlers running at once never exceed the concurrency; a
costly job is started in its turn, not passed over by cheap ones; the jobs a claim took
past the slots free are given back uncharged; and what cannot fit is refused. The
SlotGate's own logic is in tests/unit/test_slots.py; the kills in
tests/faults/test_cost.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.store.limits import LimitStore
from forklift.testing import wait_for
from forklift.workers import Worker, WorkerConfig
from forklift.workers.claimer import Claimer
from forklift.workers.holdings import Holdings
from forklift.workers.slots import check_costs, costs
from tests.integration.conftest import RunWorker

Db = psycopg.Connection[Any]


class Meter:
    """The slots the handlers running take, at most, and the order they started in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0
        self.started: list[str] = []

    def run(self, name: str, cost: int, seconds: float) -> None:
        with self.lock:
            self.now += cost
            self.most = max(self.most, self.now)
            self.started.append(name)
        time.sleep(seconds)
        with self.lock:
            self.now -= cost


@pytest.fixture
def meter() -> Meter:
    return Meter()


@pytest.fixture
def app(dsn: str, schema: str, meter: Meter) -> Iterator[forklift.App]:
    a = forklift.App(dsn, schema=schema)

    @a.task(cost=3, queue="big")
    def heavy(ctx: forklift.JobContext, *, n: int = 0, seconds: float = 0.05) -> None:
        meter.run(f"heavy{n}", 3, seconds)

    @a.task(cost=2)
    def double(ctx: forklift.JobContext, *, n: int = 0, seconds: float = 0.05) -> None:
        meter.run(f"double{n}", 2, seconds)

    @a.task
    def light(ctx: forklift.JobContext, *, n: int = 0, seconds: float = 0.02) -> None:
        meter.run(f"light{n}", 1, seconds)

    a.migrate()
    yield a
    a.close()


def finished(db: Db, schema: str) -> bool:
    row = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE state <> 'succeeded'").fetchone()
    return row == (0,)


def attempts(db: Db, schema: str) -> set[int]:
    return {r[0] for r in db.execute(f"SELECT attempts FROM {schema}.jobs")}


@pytest.mark.parametrize("prefetch", [True, False])
def test_the_handlers_running_never_take_more_slots_than_the_worker_has(
    app: forklift.App, db: Db, run_worker: RunWorker, meter: Meter, prefetch: bool
) -> None:
    jobs = [("heavy", {"n": i}) for i in range(8)] + [("double", {"n": i}) for i in range(8)]
    jobs += [("light", {"n": i}) for i in range(40)]
    app.enqueue_many(jobs[::3] + jobs[1::3] + jobs[2::3])  # mixed in line
    run_worker(concurrency=4, prefetch=prefetch, queues=("default", "big"))
    wait_for(lambda: finished(db, app.schema), timeout=60, what="every job done")
    assert meter.most <= 4
    assert meter.most >= 3  # they did run side by side where they fit
    assert len(meter.started) == len(jobs)
    assert attempts(db, app.schema) == {1}  # a job given back after its claim was not charged


def test_a_costly_job_starts_in_its_turn_not_after_every_cheap_one(
    app: forklift.App, db: Db, run_worker: RunWorker, meter: Meter
) -> None:
    """Two slots, two cheap jobs running: the heavy one after them in line waits for both
    to end (it is not passed over by the cheap ones behind it, which would fit the slot
    each frees), then runs alone."""
    app.enqueue_many([("light", {"n": i, "seconds": 0.3}) for i in range(2)])
    app.enqueue("double", {"n": 0, "seconds": 0.1})
    app.enqueue_many([("light", {"n": i, "seconds": 0.05}) for i in range(2, 8)])
    run_worker(concurrency=2, prefetch=False)
    wait_for(lambda: finished(db, app.schema), timeout=30, what="every job done")
    assert meter.started.index("double0") == 2
    assert meter.most <= 2
    assert attempts(db, app.schema) == {1}


def test_a_claim_gives_back_at_once_the_jobs_past_its_slots(app: forklift.App, db: Db) -> None:
    """Two slots free: of the jobs a claim took, it keeps those in line order while their
    costs fit, and the first whatever it costs; the rest go back at once, ready, their
    attempt not counted, for a worker with the slots (not held until the prefetch's
    release, a claim of this worker's own slots)."""
    ids = app.enqueue_many([("double", {"n": i}) for i in range(2)] + [("light", {})])
    limits = LimitStore(app.store.pool, app.schema, "test")
    claimer = Claimer(
        app.store, limits, ["default"], {}, "host:1:cost", 30.0, Holdings(2, costs(app, 2))
    )

    def claim(free: int) -> list[int]:
        return [j.id for j in claimer.claim(free, expired=False).jobs]

    assert claim(2) == [ids[0]]  # the second double would take 4 slots of 2
    assert claim(1) == [ids[1]]  # the first, whatever it costs: it waits for its slots
    assert claim(2) == [ids[2]]
    rows = db.execute(f"SELECT state::text, attempts FROM {app.schema}.jobs ORDER BY id")
    assert rows.fetchall() == [("running", 1)] * 3


def test_a_job_waiting_for_its_slots_is_not_given_back_and_claimed_again_in_a_loop(
    app: forklift.App, db: Db, run_worker: RunWorker, meter: Meter, caplog: Any
) -> None:
    """A heavy job runs (3 of 4 slots); the job next in line costs 2: claimed into the one
    slot free, it waits for its slots, its place kept. It was given back as "waited too
    long for a slot" (the prefetch's release of jobs waiting behind a long one) and, the
    slot free again, claimed again at once by the same worker: a claim and a release
    every few milliseconds for as long as the heavy job ran (80 to 280 a second)."""
    app.enqueue("heavy", {"seconds": 1.0}, queue="big")
    run_worker(concurrency=4, queues=("default", "big"))
    wait_for(lambda: meter.started == ["heavy0"], what="the heavy job started")
    with caplog.at_level("DEBUG", logger="forklift.workers.worker"):
        app.enqueue("double", {"seconds": 0.05})
        wait_for(lambda: finished(db, app.schema), timeout=30, what="both jobs done")
    released = [r for r in caplog.records if "job.released" in r.getMessage()]
    assert released == [], [r.getMessage() for r in released[:3]]
    assert meter.started == ["heavy0", "double0"] and meter.most == 3


def test_a_worker_refuses_queues_whose_tasks_cost_more_than_its_slots(app: forklift.App) -> None:
    with pytest.raises(forklift.ConfigError, match=r"'heavy' costs 3 slots.*concurrency \(2\)"):
        Worker(app, WorkerConfig(concurrency=2, queues=("default", "big")))
    check_costs(app, WorkerConfig(concurrency=2))  # not its queue
    # A heavy job enqueued to a queue whose workers have fewer slots runs alone.
    assert costs(app, 2) == {"heavy": 2, "double": 2}
    assert costs(app, 8) == {"heavy": 3, "double": 2}


@pytest.mark.parametrize("cost", [0, -1, 1.5, "2", True])
def test_a_bad_cost_is_refused_at_declaration(dsn: str, schema: str, cost: object) -> None:
    a = forklift.App(dsn, schema=schema)
    options: dict[str, Any] = {"cost": cost}
    with pytest.raises(forklift.ConfigError, match="cost must be an int >= 1"):

        @a.task(**options)
        def t(ctx: forklift.JobContext) -> None: ...


def test_an_async_task_may_not_cost_more_than_one(dsn: str, schema: str) -> None:
    a = forklift.App(dsn, schema=schema)
    with pytest.raises(forklift.ConfigError, match="cost= is for plain def handlers"):

        @a.task(cost=2)
        async def t(ctx: forklift.JobContext) -> None: ...
