"""Job cost under real faults (issue 40): three `forklift run` supervisors of this module's
app (APP), WORKERS workers each at --concurrency 4, run `heavy` (cost 3), `double` (cost
2) and `light` (cost 1) jobs, mixed in line and enqueued in waves, while workers are
SIGKILLed mid-run (heavy jobs among the runs hit) and the database restarts. Every job
must succeed, its effect committed once, by its last attempt; every kill land mid-run
(its run never ended, its attempt ended as WorkerDied, its job ran again); and in no
worker process may the runs in progress at any moment take more than its 4 slots, while
heavy jobs do run beside others there. (One process: tests/integration/test_cost.py.)

Checked on what ran: each handler writes its start (`runs`, on a connection of its own,
so killed runs too: pid, cost) after it got its slots (SlotGate.enter), and its end,
after its effect committed, before it gives them back; on the database clock
(clock_timestamp(), one server). So a run with an end counts from its start to its end.
A run without one was killed, or its end's write was lost to the restart: it may have
returned long before (counting it until its process died could count slots no longer
held), so it counts from its start to the last moment it is known to have held them:
its effect's insert (`effects.at`, in the handler) if that committed; for the run a kill
was aimed at, the moment read while its worker stood still mid-run (SIGSTOP, the read,
SIGKILL); else its start alone. No moment then counts slots not taken (nor does a pid
reused: a dead process's runs all count before its death), and a worker running more
than its slots' worth (its gate disabled) shows among the hundreds of runs that ended.
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import random
import signal
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift._ids import owner_process
from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.acceptance.proxy import Proxy
from tests.apps._recording import write
from tests.faults.harness import Fleet, Workload, stopped_mid_run
from tests.faults.injector import Fault, Injector

# -- the app (run by the supervisors as APP) -----------------------------------------------

APP = "tests.faults.test_cost:app"
COSTS = {"heavy": 3, "double": 2, "light": 1}
QUICK = forklift.Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0)
ATTEMPTS, CRASHES = 20, 10  # room for the faults: a kill or a restart costs an attempt
PAUSE = 0.15  # seconds each run sleeps before its effect: runs overlap, kills land in it

TABLES = """
CREATE TABLE {schema}.runs (
    token    text PRIMARY KEY,        -- one run (a retried insert of it is one row)
    job_id   bigint NOT NULL,
    attempt  integer NOT NULL,
    task     text NOT NULL,
    cost     integer NOT NULL,        -- the slots its task takes
    pid      integer NOT NULL,        -- its worker process
    started  timestamptz NOT NULL,    -- the handler's start (database clock)
    ended    timestamptz              -- the handler's end; NULL: killed, or not written
);
ALTER TABLE {schema}.effects ADD COLUMN run text;
"""
START = """INSERT INTO {s}.runs (token, job_id, attempt, task, cost, pid, started)
VALUES (%s, %s, %s, %s, %s, %s, clock_timestamp()) ON CONFLICT (token) DO NOTHING"""
EFFECT = "INSERT INTO {s}.effects (key, job_id, attempt, run) VALUES (%s, %s, %s, %s)"
END = "UPDATE {s}.runs SET ended = clock_timestamp() WHERE token = %s"


def _run(task: str, ctx: forklift.JobContext, key: str) -> str:
    """Record the run's start (a run that cannot does nothing else and fails), sleep
    PAUSE, commit the effect keyed `key` with the run's token, record the run's end."""
    s, token = app.schema, uuid.uuid4().hex
    start = (token, ctx.job_id, ctx.attempt, task, COSTS[task], os.getpid())
    write(app, "cost-runs", START.format(s=s), start)
    time.sleep(PAUSE)  # the window in which a test kills it
    with ctx.transaction() as conn:
        conn.execute(EFFECT.format(s=s), (key, ctx.job_id, ctx.attempt, token))
    try:  # an end not written (the database away) leaves the run open
        write(app, "cost-runs", END.format(s=s), (token,))
    except psycopg.Error:
        pass
    return key


app = forklift.App()


def declare(task: str) -> None:
    """Declare `task` on APP, at its cost, with room for the faults."""

    @app.task(
        name=task, backoff=QUICK, cost=COSTS[task], max_attempts=ATTEMPTS, max_crashes=CRASHES
    )
    def handler(ctx: forklift.JobContext, *, key: str) -> str:
        return _run(task, ctx, key)


for _task in COSTS:
    declare(_task)


# -- the test's plan -----------------------------------------------------------------------

SUPERVISORS, WORKERS, CONCURRENCY = 3, 2, 4
LEASE = 3.0  # seconds
KILL, RESTART = "kill worker", "db restart"
# Each fault: a worker's SIGKILL aimed at a job of a task mid-run, or the restart.
PLAN = ((KILL, "heavy"), (KILL, "double"), (KILL, "light"), (RESTART, ""),
        (KILL, "heavy"), (KILL, "double"), (KILL, "heavy"))  # fmt: skip
PER_WAVE = {"heavy": 12, "double": 16, "light": 40}  # before each fault, and after the last


def wave(n: int) -> list[forklift.JobSpec]:
    """Wave `n`: PER_WAVE jobs of each task, mixed in line (a seeded shuffle)."""
    tasks = [task for task, count in PER_WAVE.items() for _ in range(count)]
    random.Random(n).shuffle(tasks)
    return [
        forklift.JobSpec(t, {"key": f"{t}-{n}-{i}"}, max_attempts=ATTEMPTS, max_crashes=CRASHES)
        for i, t in enumerate(tasks)
    ]


@pytest.fixture
def cost_fleet(workload: Workload, tmp_path: Path) -> Iterator[Fleet]:
    """Supervisors of APP (none started yet), connected to the cluster directly."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(TABLES.format(schema=workload.schema))
    args = ["--workers", str(WORKERS), "--concurrency", str(CONCURRENCY),
            "--lease", f"{LEASE:g}s", "--grace", "5s"]  # fmt: skip
    fleet = Fleet.for_workload(workload, tmp_path, args, app=APP)
    yield fleet
    fleet.kill()


@pytest.fixture
def injector(cluster: Cluster, proxy: Proxy, cost_fleet: Fleet, workload: Workload) -> Injector:
    return Injector(cluster, proxy, cost_fleet, workload, lease=LEASE)


# -- the run -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aim:
    """A kill: the run it hit (`runs.token`), a moment it still ran (None: not read)."""

    job_id: int
    run: str
    at: dt.datetime | None


# The runs of `task` mid-run: begun 10 ms ago or more, with half their pause left.
HELD = """
SELECT j.id, r.token, j.lease_owner FROM {s}.jobs AS j
JOIN {s}.runs AS r ON r.job_id = j.id AND r.attempt = j.attempts
WHERE j.state = 'running' AND j.task = %s AND r.ended IS NULL
  AND r.started < clock_timestamp() - interval '10 ms'
  AND r.started > clock_timestamp() - make_interval(secs => %s)
ORDER BY r.started DESC
"""
# Whether the job of run `token` ran again since; whether a run begun since `at` ended.
AGAIN = """SELECT EXISTS (SELECT 1 FROM {s}.runs AS r, {s}.runs AS hit
WHERE hit.token = %s AND r.job_id = hit.job_id AND r.started > hit.started)"""
RESUMED = "SELECT count(*) > 0 FROM {s}.runs WHERE started > %s AND ended IS NOT NULL"


def kill_one(workload: Workload, fleet: Fleet, task: str) -> Aim | None:
    """SIGKILL the worker of a `task` job mid-run, the moment read while it stands still
    (harness.stopped_mid_run); None if none is, or if it ended before it stood still."""
    fleet.check_alive()
    workers = set(fleet.workers())
    try:
        with psycopg.connect(workload.dsn, autocommit=True, connect_timeout=3) as db:
            rows = db.execute(HELD.format(s=workload.schema), (task, PAUSE / 2)).fetchall()
    except psycopg.OperationalError:
        return None
    for job_id, run, owner in rows:
        pid = owner_process(owner)[1]
        if pid not in workers:
            continue  # a worker killed before, or started since
        if not stopped_mid_run(workload, pid, run):
            return None  # it ended before it stood still
        at = workload.scalar("SELECT clock_timestamp()")
        os.kill(pid, signal.SIGKILL)
        return Aim(job_id, run, at)
    return None


def play(workload: Workload, fleet: Fleet, injector: Injector) -> tuple[list[Aim], list[str]]:
    """PLAN, a wave of jobs before each fault and after the last; after a kill, until its
    job ran again; after the restart, until a run begun since ended. (Aims, faults done.)"""
    aims, done = [], []
    for n, (fault, task) in enumerate(PLAN):
        workload.app.enqueue_many(wave(n))  # a producer: it declares no task
        if fault == RESTART:
            since = workload.scalar("SELECT clock_timestamp()")
            done.append(f"{fault} {injector.inject(Fault.DB_RESTART).detail}")
            resumed = functools.partial(workload.scalar, RESUMED, since)
            wait_for(resumed, 30, 0.02, f"work after the {fault}")
            continue
        kill = functools.partial(kill_one, workload, fleet, task)
        aims.append(aim := wait_for(kill, 30, 0.005, f"a {task} job mid-run"))
        done.append(f"{fault} {task} job {aim.job_id}")
        again = functools.partial(workload.scalar, AGAIN, aim.run)
        wait_for(again, 30, 0.02, f"job {aim.job_id} run again after {fault}")
    workload.app.enqueue_many(wave(len(PLAN)))
    return aims, done


# -- what the run left ---------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    job_id: int
    attempt: int
    task: str
    cost: int
    pid: int
    started: dt.datetime
    ended: dt.datetime | None


@dataclass
class Record:
    jobs: dict[int, tuple[str, str, int, list[dict[str, Any]]]]  # task, state, attempts, errors
    runs: dict[str, Run]  # by token
    effects: list[tuple[int, int, str, dt.datetime]]  # job, attempt, run, its insert


def read(workload: Workload) -> Record:
    s = workload.schema
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        jobs = db.execute(f"SELECT id, task, state::text, attempts, errors FROM {s}.jobs")
        runs = db.execute(
            f"SELECT token, job_id, attempt, task, cost, pid, started, ended FROM {s}.runs"
        )
        effects = db.execute(f"SELECT job_id, attempt, run, at FROM {s}.effects").fetchall()
        return Record({j[0]: j[1:] for j in jobs}, {r[0]: Run(*r[1:]) for r in runs}, effects)


def finished_once(rec: Record, workload: Workload) -> list[str]:
    """Every job succeeded, its effect committed once, by its last attempt."""
    effects: dict[int, list[int]] = defaultdict(list)
    for job_id, attempt, _, _ in rec.effects:
        effects[job_id].append(attempt)
    return workload.verdict().problems + [
        f"job {i} ({task}): {state}, effects of attempts {effects.get(i)}, {attempts} attempts"
        for i, (task, state, attempts, _) in rec.jobs.items()
        if state != "succeeded" or effects.get(i) != [attempts]
    ]


def aims_landed(rec: Record, aims: list[Aim]) -> list[str]:
    """Each kill landed mid-run: the run it hit never ended, its attempt ended as its
    worker's death (WorkerDied, in its job's errors), and its job ran again."""
    found = []
    for aim in aims:
        hit, errors = rec.runs[aim.run], rec.jobs[aim.job_id][3]
        again = [r for r in rec.runs.values() if r.job_id == hit.job_id and r.started > hit.started]
        died = [e for e in errors if e.get("attempt") == hit.attempt
                and str(e.get("error")).startswith("WorkerDied")]  # fmt: skip
        if hit.ended is not None or not again or not died:
            found.append(f"{aim}: ended {hit.ended}, {len(again)} runs after it: {errors}")
    return found


def loads(rec: Record, aims: list[Aim]) -> list[tuple[int, dt.datetime, list[Run]]]:
    """At each run's start (where the slots in use rise), in its worker process (pid):
    the runs in progress, itself first. A run counts from its start to its end or,
    without one, to the last moment known within it (the module docstring); one ending
    at that very moment is not counted."""
    known: dict[str, list[dt.datetime]] = defaultdict(list)
    for _, _, token, at in rec.effects:
        known[token].append(at)
    for aim in aims:
        known[aim.run] += [aim.at] if aim.at is not None else []
    spans: dict[int, list[tuple[dt.datetime, dt.datetime, Run]]] = defaultdict(list)
    for token, run in rec.runs.items():
        spans[run.pid].append((run.started, run.ended or max([run.started, *known[token]]), run))
    return [
        (pid, at, [this, *(r for s, e, r in runs if r is not this and s <= at < e)])
        for pid, runs in spans.items()
        for at, _, this in runs
    ]


# -- the test ------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_the_runs_of_a_worker_never_take_more_slots_than_it_has_under_faults(
    workload: Workload, cost_fleet: Fleet, injector: Injector
) -> None:
    cost_fleet.start(SUPERVISORS)
    cost_fleet.wait_ready()
    started = time.monotonic()
    aims, done = play(workload, cost_fleet, injector)
    workload.wait_finished(timeout=60, check=cost_fleet.procs)
    cost_fleet.check_alive()
    rec = read(workload)
    moments = loads(rec, aims)
    slots = Counter(sum(r.cost for r in runs) for _, _, runs in moments)
    # Heavy runs beside others in one worker: the gate fits them in, not runs them alone.
    beside = Counter(
        "+".join(sorted(r.task for r in runs))
        for _, _, runs in moments
        if len(runs) > 1 and any(r.task == "heavy" for r in runs)
    )
    open_runs, pids = sum(r.ended is None for r in rec.runs.values()), {m[0] for m in moments}
    print(
        f"{len(rec.jobs)} jobs, {len(rec.runs)} runs ({open_runs} without an end) on"
        f" {len(pids)} workers in {time.monotonic() - started:.1f} s; slots in use at each"
        f" start: {sorted(slots.items())}; heavy beside others: {dict(beside)}; {done}"
    )
    output = cost_fleet.output()[-3000:]
    overbooked = [
        f"pid {pid} at {at.time()}: {sum(r.cost for r in runs)} slots,"
        f" {[(r.task, r.job_id, r.attempt) for r in runs]}"
        for pid, at, runs in moments
        if sum(r.cost for r in runs) > CONCURRENCY
    ]
    for problems in (finished_once(rec, workload), aims_landed(rec, aims), overbooked):
        assert problems == [], f"{len(problems)}: {problems[:10]}\n{output}"
    assert len(rec.jobs) == (len(PLAN) + 1) * sum(PER_WAVE.values()), len(rec.jobs)
    assert len(aims) == len(PLAN) - 1 and len(done) == len(PLAN), done
    assert slots[CONCURRENCY] > 0 and beside, (slots, beside)  # not a vacuous bound
