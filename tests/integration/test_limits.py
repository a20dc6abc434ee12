"""Limits in the claim: declaration errors, keys computed at enqueue, what a claim under
limits admits and passes over, rate windows, queue limits, a worker that sleeps while all
its work is held back, and backpressure (QueueFull)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import psycopg
import pytest
from psycopg.types.json import Jsonb

import forklift
from forklift.store import Claim, ClaimedJob
from forklift.store.limits import LimitStore
from forklift.testing import wait_for
from forklift.workers import Worker, WorkerConfig
from forklift.workers.claimer import Claimer

Db = psycopg.Connection[Any]


@pytest.fixture
def app(dsn: str, schema: str) -> Iterator[forklift.App]:
    a = forklift.App(dsn, schema=schema)

    @a.task(limit=forklift.Limit(concurrency=1, key="account"))
    def charge(ctx: forklift.JobContext, *, account: str, cents: int = 0) -> None: ...

    @a.task(limit=forklift.Limit(concurrency=2))
    def resize(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    @a.task(limit=forklift.Limit(rate=5, per=1.0))
    def call_api(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    @a.task(limit=forklift.Limit(concurrency=1, key=lambda args: args["host"].lower()))
    def fetch(ctx: forklift.JobContext, *, host: str) -> None: ...

    @a.task
    def plain(ctx: forklift.JobContext, *, n: int = 0) -> None: ...

    yield a
    a.close()


@pytest.fixture
def limits(app: forklift.App) -> LimitStore:
    store = LimitStore(app.store.pool, app.schema, "test")
    store.register({name: task.limit for name, task in app.tasks.items()})
    return store


def claim(
    limits: LimitStore, app: forklift.App, owner: str, n: int = 10, *, expired: bool = False
) -> list[tuple[str, dict[str, Any]]]:
    jobs, *_ = limits.claim(["default"], sorted(app.tasks), owner, n, 30.0, expired=expired)
    return [(j.task, j.args) for j in jobs]


def finish(db: Db, schema: str, task: str, **args: Any) -> None:
    """End one running job of `task` (with these args) as succeeded."""
    found = db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', lease_owner = NULL, completed_at = now()"
        f" WHERE id = (SELECT id FROM {schema}.jobs WHERE state = 'running' AND task = %s"
        "  AND args @> %s::jsonb ORDER BY id LIMIT 1) RETURNING id",
        (task, Jsonb(args)),
    ).fetchone()
    assert found is not None, f"no running {task} {args}"


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: forklift.Limit(), "give concurrency=, rate= or both"),
        (lambda: forklift.Limit(concurrency=0), "concurrency must be a whole number >= 1"),
        (lambda: forklift.Limit(concurrency=-1), "concurrency must be a whole number >= 1"),
        (lambda: forklift.Limit(concurrency=True), "concurrency must be a whole number >= 1"),
        (lambda: forklift.Limit(rate=0), "rate must be a whole number >= 1"),
        (lambda: forklift.Limit(rate=10, per=0), "per must be > 0 seconds"),
        (lambda: forklift.Limit(rate=10, per=float("inf")), "per must be > 0 seconds"),
        (lambda: forklift.Limit(concurrency=1, key="not a name"), "is not an argument name"),
        (
            lambda: forklift.Limit(concurrency=1, key=cast(Any, 3)),
            "must be an argument name or a callable",
        ),
    ],
)
def test_a_bad_limit_is_a_config_error(make: Any, message: str) -> None:
    with pytest.raises(forklift.ConfigError, match=message):
        make()


def test_a_key_naming_no_argument_is_a_config_error_at_declaration() -> None:
    app = forklift.App("postgresql://nowhere/x")
    with pytest.raises(forklift.ConfigError, match=r"names no argument .*takes: account"):

        @app.task(limit=forklift.Limit(concurrency=1, key="acount"))
        def charge(ctx: forklift.JobContext, *, account: str) -> None: ...

    with pytest.raises(forklift.ConfigError, match=r"must be a forklift\.Limit"):
        app.task(limit=4)(lambda ctx: None)  # type: ignore[call-overload]


def test_the_key_is_stored_at_enqueue(app: forklift.App, db: Db, schema: str) -> None:
    ids = [
        app.enqueue("charge", {"account": "acme"}),
        app.enqueue("fetch", {"host": "Example.COM"}),
        app.enqueue("resize", {}),
    ]
    rows = db.execute(
        f"SELECT limit_key FROM {schema}.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    # resize's limit has no key: '' (every job of a limited task is stored with a key)
    assert [r[0] for r in rows] == ["acme", "example.com", ""]
    with pytest.raises(forklift.ArgumentError, match=r"limit's key raised AttributeError"):
        app.enqueue("fetch", {"host": 5})
    assert app.tasks["fetch"].limit_key({"host": "A"}) == "a"


def test_one_per_key_and_a_busy_key_does_not_hide_the_others(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    app.enqueue_many([("charge", {"account": "a", "cents": i}) for i in range(50)])
    app.enqueue_many([("charge", {"account": "b", "cents": i}) for i in range(3)])
    # One of a's (its first in line), and b's first behind a's 49 others.
    got = claim(limits, app, "w1")
    assert got == [
        ("charge", {"account": "a", "cents": 0}),
        ("charge", {"account": "b", "cents": 0}),
    ]
    assert claim(limits, app, "w2") == []
    held = db.execute(
        f"SELECT count(*), max(attempts) FROM {schema}.jobs WHERE state = 'ready'"
    ).fetchone()
    assert held == (51, 0)  # held back: still ready, no attempt counted
    finish(db, schema, "charge", account="a", cents=0)
    # The next in line of a runs (its place kept), and b still runs one.
    assert claim(limits, app, "w1") == [("charge", {"account": "a", "cents": 1})]


def test_priority_then_due_time_decides_who_runs_when_a_slot_frees(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    first = app.enqueue("resize", {"n": 0})
    app.enqueue("resize", {"n": 1})
    app.enqueue("resize", {"n": 2})
    app.enqueue("resize", {"n": 3}, priority=5)
    got = claim(limits, app, "w1")
    assert got == [("resize", {"n": 3}), ("resize", {"n": 0})]  # concurrency 2, in line
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', lease_owner = NULL WHERE id = %s", (first,)
    )
    assert claim(limits, app, "w2") == [("resize", {"n": 1})]
    assert claim(limits, app, "w2") == []


def test_unlimited_jobs_are_claimed_beside_limited_ones(
    app: forklift.App, limits: LimitStore
) -> None:
    app.enqueue_many([("resize", {"n": i}) for i in range(5)] + [("plain", {"n": 1})])
    got = claim(limits, app, "w1")
    assert sorted(t for t, _ in got) == ["plain", "resize", "resize"]


def test_a_rate_is_a_sliding_window_that_allows_a_burst_then_waits(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    app.enqueue_many([("call_api", {"n": i}) for i in range(12)])
    assert len(claim(limits, app, "w1")) == 5  # the whole burst at once
    assert claim(limits, app, "w1") == []
    wake = limits.wake_in(["default"], sorted(app.tasks))
    assert wake is not None and 0.5 < wake <= 1.02  # when the burst leaves the window
    deadline = time.monotonic() + 5
    got: list[tuple[str, dict[str, Any]]] = []
    while len(got) < 7 and time.monotonic() < deadline:
        got += claim(limits, app, "w1")
        time.sleep(0.01)  # a poll with a deadline, each claim exact
    assert len(got) == 7
    starts = [
        r[0]
        for r in db.execute(
            f"SELECT extract(epoch FROM started_at) FROM {schema}.jobs"
            " WHERE task = 'call_api' ORDER BY started_at"
        )
    ]
    assert len(starts) == 12
    for i, at in enumerate(starts):  # any window of 1 s holds at most 5 starts
        assert sum(1 for s in starts[i:] if s - at < 1.0) <= 5, starts


def test_a_window_full_at_the_claim_that_freed_since_says_claim_now_not_sleep(
    app: forklift.App, limits: LimitStore
) -> None:
    """The worker asks when to claim again after a claim that took nothing: a window
    that was full then and has freed before the question says 0, not None (None sleeps a
    whole poll interval, though nothing will notify: a rate of 500/s started ~320/s)."""
    app.enqueue_many([("call_api", {"n": i}) for i in range(12)])
    assert len(claim(limits, app, "w1")) == 5
    claimed_at = time.monotonic()
    assert claim(limits, app, "w1") == []  # the window is full
    wake = limits.wake_in(["default"], sorted(app.tasks))
    assert wake is not None and wake > 0.5
    time.sleep(wake + 0.05)  # the burst left the window: it is open now
    assert limits.wake_in(["default"], sorted(app.tasks)) is None  # asked as of now
    since = time.monotonic() - claimed_at  # asked as of the claim
    assert limits.wake_in(["default"], sorted(app.tasks), since) == 0.0
    assert len(claim(limits, app, "w1")) == 5


def test_queue_limits_combine_with_task_limits(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    db.execute(
        f"INSERT INTO {schema}.limits (scope, name, concurrency) VALUES ('queue', 'default', 3)"
    )
    app.enqueue_many([("resize", {"n": i}) for i in range(4)])
    app.enqueue_many([("plain", {"n": i}) for i in range(4)])
    got = claim(limits, app, "w1")
    assert len(got) == 3 and sum(t == "resize" for t, _ in got) == 2
    assert claim(limits, app, "w2") == []


def test_jobs_under_a_limit_the_claim_does_not_hold_wait_for_one_that_does(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """A worker whose app does not declare `resize` does not lock its limit, so it may
    not run its jobs (another worker's app counts them)."""
    app.enqueue_many([("resize", {"n": 1}), ("plain", {"n": 2})])
    jobs, *_ = limits.claim(["default"], ["plain"], "other-app", 10, 30.0, expired=False)
    assert [j.task for j in jobs] == ["plain"]


def test_an_expired_job_keeps_its_slot_and_is_rerun_within_the_limit(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    app.enqueue_many([("resize", {"n": i}) for i in range(4)])
    assert len(claim(limits, app, "dead-worker")) == 2
    db.execute(
        f"UPDATE {schema}.jobs SET lease_until = now() - interval '1 s' WHERE state = 'running'"
    )
    again = claim(limits, app, "w2", expired=True)
    assert sorted(a["n"] for _, a in again) == [0, 1]  # the two expired, not more
    running = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE state = 'running'").fetchone()
    assert running == (2,)


def test_a_worker_with_only_held_back_work_sleeps_then_wakes_when_a_slot_frees(
    app: forklift.App, db: Db, schema: str
) -> None:
    release = threading.Event()
    started: list[int] = []

    @app.task(name="slow", limit=forklift.Limit(concurrency=1))
    def slow(ctx: forklift.JobContext) -> None:
        started.append(ctx.job_id)
        release.wait(10)

    app.enqueue_many([("slow", {}) for _ in range(3)])
    worker = Worker(app, WorkerConfig(concurrency=4, maintenance=False, poll_interval=30.0))
    worker.booted.enable()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        worker.booted.wait()
        wait_for(lambda: len(started) == 1, what="the first job started")
        claims = worker.claimer.limits.claim
        calls = []

        def counted(*args: Any, **kwargs: Any) -> Any:
            calls.append(time.monotonic())
            return claims(*args, **kwargs)

        worker.claimer.limits.claim = counted  # type: ignore[method-assign]
        time.sleep(1.5)  # the window in which a spinning worker would claim again and again
        assert len(calls) <= 2, f"{len(calls)} claims while everything was held back"
        release.set()  # the job ends: its freed slot notifies, the next starts
        wait_for(lambda: len(started) == 3, timeout=5, what="the held-back jobs ran")
    finally:
        release.set()
        worker.request_stop(fast=True)
        thread.join(timeout=15)


def test_a_limited_job_that_stops_running_notifies_its_queue(
    app: forklift.App, limits: LimitStore, dsn: str, db: Db, schema: str
) -> None:
    app.enqueue_many([("resize", {"n": 1}), ("plain", {"n": 2})])
    assert len(claim(limits, app, "w1")) == 2
    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {schema}_jobs")
        finish(db, schema, "plain", n=2)  # not limited: nobody is woken
        assert list(listener.notifies(timeout=0.3)) == []
        finish(db, schema, "resize", n=1)
        heard = [(n.channel, n.payload) for n in listener.notifies(timeout=2, stop_after=1)]
    assert heard == [(f"{schema}_jobs", "default")]


def test_a_full_queue_refuses_enqueues_all_or_nothing(
    app: forklift.App, db: Db, schema: str
) -> None:
    db.execute(
        f"INSERT INTO {schema}.limits (scope, name, max_depth) VALUES ('queue', 'default', 3)"
    )
    app.enqueue("plain", {"n": 1})
    app.enqueue("plain", {"n": 2}, delay=60)  # scheduled jobs count too
    with pytest.raises(forklift.QueueFull, match=r"queue 'default' is full: 2 ready"):
        app.enqueue_many([("plain", {"n": 3}), ("plain", {"n": 4})])
    app.enqueue("plain", {"n": 3})
    with pytest.raises(forklift.QueueFull) as caught:
        app.enqueue("plain", {"n": 4})
    assert (caught.value.depth, caught.value.max_depth) == (3, 3)
    app.enqueue("plain", {"n": 5}, queue="other")  # other queues are not limited
    rows = db.execute(f"SELECT count(*) FROM {schema}.jobs WHERE queue = 'default'").fetchone()
    assert rows == (3,)
    rejected = f"SELECT rejected FROM {schema}.limits WHERE scope = 'queue'"
    wait_for(lambda: db.execute(rejected).fetchone() == (3,), what="refusals counted, apart")
    # A producer's own transaction sees the refusal too.
    with db.transaction(), pytest.raises(forklift.QueueFull):
        app.enqueue("plain", {"n": 6}, conn=db)


def most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most of these [start, end) spans that overlap at any instant."""
    edges = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    now = peak = 0
    for _, step in edges:
        now += step
        peak = max(peak, now)
    return peak


def test_claimers_racing_in_threads_never_exceed_a_limit(
    app: forklift.App, limits: LimitStore, dsn: str, db: Db, schema: str
) -> None:
    """Six claimers at once, each ending what it claimed after a moment: the spans from
    each claim (started_at, set under the limit's lock) to its end (completed_at) never
    overlap past the limit, per key and per task."""
    app.enqueue_many([("charge", {"account": f"k{i % 3}", "cents": i}) for i in range(150)])
    app.enqueue_many([("resize", {"n": i}) for i in range(100)])
    errors: list[BaseException] = []

    def claimer(owner: str) -> None:
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while True:
                    jobs, *_ = limits.claim(
                        ["default"], sorted(app.tasks), owner, 3, 30, expired=False
                    )
                    if (
                        not jobs
                        and not conn.execute(
                            f"SELECT 1 FROM {schema}.jobs WHERE state <> 'succeeded' LIMIT 1"
                        ).fetchone()
                    ):
                        return
                    for job in jobs:
                        time.sleep(0.001)
                        conn.execute(
                            f"UPDATE {schema}.jobs SET state = 'succeeded', lease_owner = NULL,"
                            " completed_at = clock_timestamp() WHERE id = %s",
                            (job.id,),
                        )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    rows = db.execute(
        f"SELECT task, limit_key, extract(epoch FROM started_at)::float8,"
        f" extract(epoch FROM completed_at)::float8 FROM {schema}.jobs"
    ).fetchall()
    assert len(rows) == 250 and all(r[3] is not None for r in rows)
    per_key = {
        k: most_at_once([(s, e) for t, key, s, e in rows if key == k]) for k in ("k0", "k1", "k2")
    }
    resize = most_at_once([(s, e) for t, _, s, e in rows if t == "resize"])
    assert max(per_key.values()) == 1 and resize <= 2, (per_key, resize)


def test_rate_windows_of_keys_gone_quiet_are_pruned(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    app.enqueue("call_api", {"n": 1})
    assert len(claim(limits, app, "w1")) == 1
    windows = f"SELECT count(*) FROM {schema}.limit_windows"
    app.store.job_prune(86400, 86400)
    assert db.execute(windows).fetchone() == (1,)  # its start is still in the window
    db.execute(f"UPDATE {schema}.limit_windows SET newest = newest - 200")
    app.store.job_prune(86400, 86400)
    assert db.execute(windows).fetchone() == (0,)


def test_a_producer_that_does_not_declare_the_task_still_keys_its_jobs(
    app: forklift.App, limits: LimitStore, dsn: str, db: Db, schema: str
) -> None:
    """A web app enqueues `charge` by name without importing it: its jobs take their
    key from the argument the workers' declaration names (read from the limits table),
    so they are limited per account like everyone else's."""
    producer = forklift.App(dsn, schema=schema)  # declares no task
    try:
        producer.enqueue_many([("charge", {"account": a, "cents": 1}) for a in "aab"])
        producer.enqueue("charge", {"account": {"id": 7}})
    finally:
        producer.close()
    keys = [r[0] for r in db.execute(f"SELECT limit_key FROM {schema}.jobs ORDER BY id")]
    assert keys == ["a", "a", "b", '{"id": 7}']
    assert keys[3] == app.tasks["charge"].limit_key({"account": {"id": 7}})
    claimed = [str(a["account"]) for _, a in claim(limits, app, "w1")]
    assert sorted(claimed) == ["a", "b", "{'id': 7}"]  # one per account


def test_a_rate_redeclared_over_another_window_keeps_the_starts_it_counted(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """Two versions declaring different windows take turns writing the limit (a rolling
    deploy, an old child restarted): each change keeps the starts made, so the rate is
    never exceeded across it."""
    app.enqueue_many([("call_api", {"n": i}) for i in range(12)])
    assert len(claim(limits, app, "w1")) == 5
    other = LimitStore(app.store.pool, app.schema, "test")
    other.register({"call_api": forklift.Limit(rate=5, per=60.0)})
    assert claim(limits, app, "w1") == []  # the 5 started count in the new window too
    limits.register({"call_api": forklift.Limit(rate=5, per=1.0)})
    assert claim(limits, app, "w1") == []  # and back: still counted, as made just now
    time.sleep(1.1)
    assert len(claim(limits, app, "w1")) == 5  # the 1 s window moved past them


def task_limit(db: Db, schema: str, name: str) -> tuple[Any, ...] | None:
    return db.execute(
        f"SELECT concurrency, keyed FROM {schema}.limits WHERE scope = 'task' AND name = %s",
        (name,),
    ).fetchone()


def test_a_rolling_deploy_keeps_the_limit_either_version_declares(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """Version 1 declares charge's limit, version 2 none (or the other way round): a
    version-2 worker starting after version 1 leaves the limit in force; it goes only
    once no worker has declared it for STALE seconds and no job claimed under it runs,
    and a version-1 worker still claiming writes it back before its next claim."""
    from forklift.store import limits as limits_module

    version2 = forklift.App(app.dsn, schema=schema)

    @version2.task(name="charge")  # its limit dropped in this version
    def charge(ctx: forklift.JobContext, *, account: str, cents: int = 0) -> None: ...

    declared = {name: task.limit for name, task in version2.tasks.items()}
    v2 = LimitStore(app.store.pool, app.schema, "test")
    v2.register(declared)  # a version-2 worker starts after version 1's
    assert task_limit(db, schema, "charge") == (1, True)
    app.enqueue_many([("charge", {"account": "a", "cents": i}) for i in range(3)])
    assert [a["cents"] for _, a in claim(limits, app, "w1")] == [0]  # one per account
    LimitStore(app.store.pool, app.schema, "test").register(declared)  # another one
    assert task_limit(db, schema, "charge") == (1, True)
    version2.close()

    # Version 1 gone for longer than STALE: the version-2 worker's next look drops it,
    # once the job claimed under it has stopped.
    db.execute(f"UPDATE {schema}.limits SET updated_at = now() - interval '1 hour'")
    v2._declared_at -= limits_module.DECLARE_EVERY
    v2.apply(["default"], ["charge"])
    assert task_limit(db, schema, "charge") == (1, True)  # its job still runs
    finish(db, schema, "charge", account="a")
    v2._declared_at -= limits_module.DECLARE_EVERY
    v2.apply(["default"], ["charge"])
    assert task_limit(db, schema, "charge") is None

    # A version-1 worker still alive declares it again before its next claim.
    limits._declared_at -= limits_module.DECLARE_EVERY
    assert limits.apply(["default"], sorted(app.tasks)).value == "exact"
    assert task_limit(db, schema, "charge") == (1, True)


def test_the_shared_path_for_a_roomy_limit_never_exceeds_it_either(
    app: forklift.App, dsn: str, db: Db, schema: str
) -> None:
    """A limit far above what runs is claimed on the shared path (claims side by side, a
    lane each); six claimers that hold what they claim push it to its limit, where
    claims go the exact way. The spans from claim to end never overlap past it."""
    from forklift.store.limits import Applying

    @app.task(name="roomy", limit=forklift.Limit(concurrency=2100))
    def roomy(ctx: forklift.JobContext) -> None: ...

    limits = LimitStore(app.store.pool, schema, "test")
    limits.register({"roomy": roomy.limit})
    assert limits.apply(["default"], ["roomy"]) is Applying.SHARED
    app.enqueue_many([("roomy", {}) for _ in range(6000)])
    paths: list[str] = []
    errors: list[BaseException] = []

    def claimer(owner: str) -> None:
        held: list[int] = []
        try:
            with psycopg.connect(dsn, autocommit=True) as conn:
                while True:
                    shared = limits.claim_shared(
                        ["default"], ["roomy"], owner, 300, 30, expired=False
                    )
                    paths.append("exact" if shared.declined else "shared")
                    jobs = shared.jobs
                    if shared.declined:
                        jobs, *_ = limits.claim(
                            ["default"], ["roomy"], owner, 300, 30, expired=False
                        )
                    held += [j.id for j in jobs]
                    if len(held) > 500 or (not jobs and held):
                        done, held = held[:256], held[256:]
                        conn.execute(
                            f"UPDATE {schema}.jobs SET state = 'succeeded', lease_owner = NULL,"
                            " completed_at = clock_timestamp() WHERE id = ANY(%s)",
                            (done,),
                        )
                    elif not jobs:
                        return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    rows = db.execute(
        f"SELECT extract(epoch FROM started_at)::float8, extract(epoch FROM completed_at)::float8"
        f" FROM {schema}.jobs"
    ).fetchall()
    assert len(rows) == 6000 and all(e is not None for _, e in rows)
    peak = most_at_once([(s, e) for s, e in rows])
    assert 1900 <= peak <= 2100, peak  # reached, never passed
    assert "shared" in paths and "exact" in paths


# -- where a claim under limits looks (migration 0007) -------------------------------


def keyed_rows(db: Db, schema: str) -> tuple[int, int]:
    """(ready jobs with no limit key, ready jobs with one)."""
    row = db.execute(
        f"SELECT count(*) FILTER (WHERE limit_key IS NULL), count(*) FILTER"
        f" (WHERE limit_key IS NOT NULL) FROM {schema}.jobs WHERE state = 'ready'"
    ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_every_job_of_a_limited_task_is_stored_with_a_key_and_the_plain_claim_leaves_it(
    app: forklift.App, db: Db, schema: str
) -> None:
    app.enqueue_many([("resize", {}), ("charge", {"account": "a"}), ("plain", {})])
    assert keyed_rows(db, schema) == (1, 2)  # resize ('': no key) and charge ('a')
    # A worker no limit applies to (the plain claim) takes only the unlimited job.
    got = app.store.job_claim(["default"], "plain-worker", 10, 30.0, expired=False)
    assert [j.task for j in got] == ["plain"]


def test_jobs_enqueued_before_their_producer_knew_the_limit_are_keyed_by_the_claim(
    app: forklift.App, limits: LimitStore, dsn: str, db: Db, schema: str
) -> None:
    """A producer enqueued 600 of one account's jobs, then 3 of another's, before any
    worker wrote the limit: stored with no key, in the plain index. The first claims
    under the limit walk past them, store their keys (they leave the plain index), and
    find b's behind a's wall within a few claims."""
    db.execute(f"DELETE FROM {schema}.limits")  # as before the workers wrote them
    producer = forklift.App(dsn, schema=schema)
    try:
        producer.enqueue_many([("charge", {"account": "a", "cents": i}) for i in range(600)])
        producer.enqueue_many([("charge", {"account": "b", "cents": i}) for i in range(3)])
    finally:
        producer.close()
    assert keyed_rows(db, schema) == (603, 0)
    limits.register({name: task.limit for name, task in app.tasks.items()})
    owners = iter(range(100))
    got: list[str] = []
    while "b" not in got:
        got += [str(a["account"]) for _, a in claim(limits, app, f"w{next(owners)}", 5)]
    assert got.count("a") == 1 and got.count("b") == 1  # one each: both keys full now
    assert next(owners) <= 6  # 600 rows keyed 261 a claim (limit 5 + REKEY 256): three walks
    unkeyed, keyed = keyed_rows(db, schema)
    assert unkeyed < 603 and keyed > 0
    assert db.execute(
        f"SELECT count(*) FROM {schema}.jobs WHERE limit_key IS NOT NULL AND limit_key <> "
        "args ->> 'account'"
    ).fetchone() == (0,)


def test_a_key_behind_a_wall_of_full_keys_is_reached_however_many_keys_wait(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """A full key's 400 jobs fill the walk's length; 80 other keys wait behind them, more
    than one claim looks at (32), two jobs each (so a key taken stays, full): claims
    look on from where the last ended, and every key gets its turn within a few."""
    app.enqueue_many([("charge", {"account": "a", "cents": i}) for i in range(400)])
    others = [f"k{i:02}" for i in range(80)]
    app.enqueue_many([("charge", {"account": k, "cents": i}) for i in range(2) for k in others])
    assert claim(limits, app, "w0", 1) == [("charge", {"account": "a", "cents": 0})]
    claimer_of = Claimer(
        app.store, limits, ["default"], {n: t.limit for n, t in app.tasks.items()}, "w1", 30.0
    )
    seen: list[str] = []
    for _ in range(4):  # 80 keys, 32 a claim: three claims and one more round
        claim_ = claimer_of.claim(100, expired=False)
        seen += [str(j.args["account"]) for j in claim_.jobs]
    assert sorted(seen) == others  # each once, none twice


def test_keyed_jobs_no_limit_covers_any_more_are_claimed_under_limits(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """The limit was dropped (or only the producer declares it): its jobs keep their
    key, so the plain claim passes them over; the limits lookup sees them, and the
    claim under limits takes them as unlimited."""
    app.enqueue_many([("charge", {"account": "a", "cents": i}) for i in range(3)])
    db.execute(f"DELETE FROM {schema}.limits WHERE name = 'charge'")
    assert limits.apply(["default"], ["plain"]).value == "none"  # not its task: not its job
    assert limits.apply(["default"], ["charge"]).value != "none"
    got = limits.claim(["default"], ["charge"], "w1", 10, 30.0, expired=False).jobs
    assert len(got) == 3  # no limit: all of them


def test_a_claim_that_completes_jobs_wakes_the_queue_only_if_it_leaves_work(
    app: forklift.App, limits: LimitStore, dsn: str, db: Db, schema: str
) -> None:
    """Completions riding with a claim free their keys' slots without the trigger's
    notification; the claim takes what they free, and notifies once only when it had
    to leave some for another worker."""
    app.enqueue_many([("charge", {"account": k, "cents": i}) for i in range(2) for k in "abc"])
    held = {str(j.args["account"]): j for j in claim_jobs(limits, 10)}
    assert sorted(held) == ["a", "b", "c"]

    def done(*keys: str) -> tuple[str, dict[str, Any]]:
        return app.store.completion([(held[k].id, held[k].attempt, None, None) for k in keys], "w1")

    with psycopg.connect(dsn, autocommit=True) as listener:
        listener.execute(f"LISTEN {schema}_jobs")
        # a's slot freed, and room to take its next: taken, nobody woken.
        got = claim_jobs(limits, 10, complete=done("a"))
        assert [str(j.args["account"]) for j in got] == ["a"]
        assert list(listener.notifies(timeout=0.3)) == []
        # b's and c's freed, but this claim takes one: the other is left, and told.
        got = claim_jobs(limits, 1, complete=done("b", "c"))
        assert [str(j.args["account"]) for j in got] == ["b"]
        heard = [n.payload for n in listener.notifies(timeout=2, stop_after=1)]
    assert heard == ["default"]
    states = dict(db.execute(f"SELECT id, state::text FROM {schema}.jobs").fetchall())
    assert [states[held[k].id] for k in "abc"] == ["succeeded"] * 3


def register_workers(db: Db, schema: str, *owners: str) -> None:
    """Live workers of the queue "default" in the process registry."""
    for owner in owners:
        db.execute(
            f"INSERT INTO {schema}.processes (id, kind, host, pid, queues) "
            "VALUES (%s, 'worker', 'here', 1, '{default}')",
            (owner,),
        )


def test_a_claim_takes_its_workers_share_of_a_limits_slots_and_leaves_the_rest(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """100 keys, one job at a time each, two live workers: a claim asking for 257 takes
    half the slots and says it took its share (and not to claim again at once); the
    other worker's claim takes the other half. Else the first worker, claiming ahead,
    would hold every key while the second found them all full."""
    app.enqueue_many([("charge", {"account": f"k{i:03}"}) for i in range(100)] * 2)
    register_workers(db, schema, "w1", "w2")

    def claim_as(owner: str) -> Claim:
        return limits.claim(["default"], ["charge"], owner, 257, 30.0, expired=False)

    first, second = claim_as("w1"), claim_as("w2")
    assert (len(first.jobs), first.shared, first.again) == (50, True, False)
    assert (len(second.jobs), second.shared) == (50, True)
    keys = {str(j.args["account"]) for j in first.jobs + second.jobs}
    assert len(keys) == 100  # one job of every key, none twice
    assert claim_as("w1").jobs == []  # every key full


def test_a_lone_worker_takes_every_slot_its_limits_have(
    app: forklift.App, limits: LimitStore, db: Db, schema: str
) -> None:
    """With one live worker of the queue (or none registered), its share is all of it."""
    app.enqueue_many([("charge", {"account": f"k{i:03}"}) for i in range(100)] * 2)
    register_workers(db, schema, "w1")
    db.execute(  # a worker of another queue does not share this one's slots
        f"INSERT INTO {schema}.processes (id, kind, host, pid, queues) "
        "VALUES ('w9', 'worker', 'here', 1, '{other}')"
    )
    got = limits.claim(["default"], ["charge"], "w1", 257, 30.0, expired=False)
    assert len(got.jobs) == 100 and got.shared


def claim_jobs(
    limits: LimitStore, n: int, *, complete: tuple[str, dict[str, Any]] | None = None
) -> list[ClaimedJob]:
    return limits.claim(
        ["default"], ["charge"], "w1", n, 30.0, expired=False, complete=complete
    ).jobs
