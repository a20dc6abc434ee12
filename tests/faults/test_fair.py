"""Fair shares under real faults (issue 40): three `forklift run` supervisors of
tests/apps/fair.py serve a backlog of one big key while workers are SIGKILLed mid-job,
one supervisor's whole process group is killed (a fresh one started in its place) and
the database restarts; meanwhile ten small keys enqueue one job each, at known moments
(right after each fault). Whatever is done to them, every job succeeds with one effect,
no run starts before its job was enqueued, a job given back by a fault keeps the turn it
was dealt at enqueue or, retried after a backoff, gives it up (migration 0023), and no
small key's job waits for the
big key's backlog: it starts before at most K of the big jobs that were still to start
when it was enqueued. The one-process cases are in tests/integration/test_fair.py.

The bound. The fleet has SLOTS = 3 supervisors x 2 workers x concurrency 1 slots and
claims no job ahead of a free slot (--no-prefetch: a job claimed ahead holds no slot, so
how many a worker holds would not follow from the slots). A small key's job `s` is dealt
the head of the line's turn `h` (its key has nothing waiting), and every job waiting
then has a turn >= h; the big key's turns are one apart (weight 1), so one big job at
most shares `h`, ahead of `s` by its id. A big job first started between s's enqueue
(`jobs.created_at`: its insert's transaction began) and s's first start is then one of:

- held then, unstarted: claimed by a claim that did not see `s` (done before s's
  insert committed, or under way meanwhile), at most one per slot, as a worker with
  its one slot busy claims nothing; or held by a worker the fault just before `s`
  killed (a group: WORKERS slots), given back later with its turn below `h`;
- a job at turn `h` ahead of `s` by its id: the big key's one job there (one job a key
  a turn), and the first of the jobs without a turn (store/fair.sql, `late`: a big job
  retried after a backoff gives its turn up, and is claimed once due as one that
  arrives, the n-th of them at `h` + n - 1);
- claimed by a claim that saw `s` but skipped it, locked by the claim that took it,
  or claimed after s's claim but started in the moment before s's handler's first
  statement: at most one per other slot, as each job runs PAUSE, far longer.

So K = 2 * SLOTS + 2 + WORKERS. Jobs given back due now after s's enqueue keep their turns,
below `h`, and run before `s`: those that had started are not counted (their first
start was before `s` came), the others are the first case. Claimed in line order
instead (no fair shares: run this module once with FORKLIFT_TEST_FAIR=off to see it
fail), `s` would start after every big job waiting when it came: the test checks that
those were many times K, so the bound is one the test could see broken.

What the bound leaves out, the run keeps out: no fault lands on a small key's job
before its handler began (the next fault waits for that: a claim of `s` rolled back by
a restart, or `s` retried after its backoff, would make it wait for the fault, not for
the backlog); and after a restart, small keys come once every slot has started a job
since (a worker's first claim after it gives back what a claim whose answer the restart
lost had leased it: one more held job per worker until then).

Times are the database's (one server): a run's start is its handler's first statement
(`runs.started`, clock_timestamp() on a connection of its own), recorded for every
attempt, killed ones too.
"""

from __future__ import annotations

import datetime as dt
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift._ids import liveness_holder, owner_process
from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.acceptance.proxy import Proxy
from tests.apps.fair import ATTEMPTS, CRASHES, RUNS, declare
from tests.faults.harness import Aim, Fleet, Workload, kill_mid_run
from tests.faults.injector import Fault, Injector

APP = "tests.apps.fair:app"
SUPERVISORS, WORKERS = 3, 2
SLOTS = SUPERVISORS * WORKERS  # concurrency 1 each
K = 2 * SLOTS + 2 + WORKERS  # the module docstring derives it
BIG, PAUSE = 500, 0.1  # the big key's backlog; seconds each job sleeps
KILL, GROUP, RESTART = "kill worker", "kill group", "db restart"
# Each moment: the fault done first (None: none), then how many small keys enqueue.
PLAN: tuple[tuple[str | None, int], ...] = (
    (None, 1), (KILL, 1), (KILL, 1), (GROUP, 1), (None, 1), (KILL, 1), (RESTART, 1),
    (KILL, 1), (None, 2),
)  # fmt: skip


@pytest.fixture
def fair_fleet(workload: Workload, tmp_path: Path) -> Iterator[Fleet]:
    """Supervisors of tests/apps/fair.py (none started yet), its runs table in the schema.
    They connect to the cluster directly: no fault here is the network's."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(RUNS.format(schema=workload.schema))
    args = ["--workers", str(WORKERS), "--lease", "3s", "--grace", "5s", "--no-prefetch"]
    fleet = Fleet.for_workload(workload, tmp_path, args, app=APP)
    yield fleet
    fleet.kill()


@pytest.fixture
def producer(workload: Workload) -> Iterator[forklift.App]:
    """An app that declares the fair task, so its enqueues draw each job's key."""
    app = forklift.App(workload.dsn, schema=workload.schema)
    declare(app)
    yield app
    app.close()


@pytest.fixture
def injector(cluster: Cluster, proxy: Proxy, fair_fleet: Fleet, workload: Workload) -> Injector:
    return Injector(cluster, proxy, fair_fleet, workload, lease=3.0)


def render(account: str, key: str) -> forklift.JobSpec:
    args = {"account": account, "key": key, "pause": PAUSE}
    return forklift.JobSpec("render", args, max_attempts=ATTEMPTS, max_crashes=CRASHES)


# -- the run -------------------------------------------------------------------------------


# A big job mid-run: its run began 10 ms ago or more, and at least half its pause is left.
HELD = """
SELECT j.id, r.token, j.lease_owner FROM {s}.jobs AS j
JOIN {s}.runs AS r ON r.job_id = j.id AND r.attempt = j.attempts
WHERE j.state = 'running' AND j.args->>'account' = 'big' AND r.ended IS NULL
  AND r.started < clock_timestamp() - interval '10 ms'
  AND r.started > clock_timestamp() - make_interval(secs => %s)
ORDER BY r.started DESC LIMIT 1
"""

# Of the big jobs not started by `since`, how many have started; whether `job` has.
PASSED = """
SELECT (SELECT count(*) FROM (SELECT 1 FROM {s}.runs WHERE account = 'big'
        GROUP BY job_id HAVING min(started) > %(since)s) AS b),
       EXISTS (SELECT 1 FROM {s}.runs WHERE job_id = %(job)s)
"""


@dataclass
class Run:
    """Drives PLAN: the faults, then the small keys' jobs, each after the last started."""

    workload: Workload
    fleet: Fleet
    injector: Injector
    producer: forklift.App
    turns: dict[int, float] = field(default_factory=dict)  # each job's, at its enqueue
    small: list[int] = field(default_factory=list)
    aims: list[Aim] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def enqueue(self, specs: list[forklift.JobSpec]) -> list[int]:
        """Enqueue `specs` in one transaction, keeping the turns they were dealt; their ids."""
        ids = self.producer.enqueue_many(specs)
        with psycopg.connect(self.workload.dsn, autocommit=True) as db:
            rows = db.execute(
                f"SELECT id, fair_turn FROM {self.workload.schema}.jobs WHERE id = ANY(%s)",
                (ids,),
            ).fetchall()
        self.turns.update(dict(rows))
        return ids

    def play(self) -> None:
        for n, (fault, keys) in enumerate(PLAN):
            for job in self.small:
                self.wait_started(job)
            if fault is not None:
                self.inject(fault)
            names = [f"small-{n}-{i}" for i in range(keys)]
            self.small += self.enqueue([render(name, name) for name in names])
        for job in self.small:
            self.wait_started(job)

    def wait_started(self, job: int) -> None:
        """Until small job `job` started; fails as soon as more than K big jobs not
        started by its enqueue started before it."""
        since = self.workload.scalar("SELECT created_at FROM {s}.jobs WHERE id = %s", job)

        def decided() -> bool:
            self.fleet.check_alive()
            row = self._passed(since, job)
            if row is None:
                return False
            passed, started = row
            assert started or passed <= K, (
                f"small job {job} not started while {passed} big jobs not started at its"
                f" enqueue did (K = {K}); faults: {self.done}"
            )
            return bool(started)

        wait_for(decided, 60, 0.01, f"small job {job} started")

    def _passed(self, since: Any, job: int) -> tuple[int, bool] | None:
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True, connect_timeout=3) as db:
                row = db.execute(
                    PASSED.format(s=self.workload.schema), {"since": since, "job": job}
                ).fetchone()
        except psycopg.OperationalError:
            return None
        assert row is not None
        return int(row[0]), bool(row[1])

    def inject(self, fault: str) -> None:
        """`fault`, aimed at a big job mid-run (a kill), or the database's restart; then
        until work goes on: a run started since, or after a restart one on every slot (a
        worker's first claim after it gives back what a claim whose answer was lost
        leased it)."""
        if fault == RESTART:
            injection = self.injector.inject(Fault.DB_RESTART)
            self.done.append(f"{fault} {injection.detail}")
        else:
            aim = wait_for(lambda: self._kill(fault), 30, 0.005, f"a big job mid-run for {fault}")
            self.aims.append(aim)
            self.done.append(f"{fault} job {aim.job_id}")
        since = self.workload.scalar("SELECT clock_timestamp()")
        slots = SLOTS if fault == RESTART else 1
        back = "SELECT count(DISTINCT pid) >= %s FROM {s}.runs WHERE started > %s"
        wait_for(lambda: self.workload.scalar(back, slots, since), 30, 0.01, f"work after {fault}")

    def _kill(self, fault: str) -> Aim | None:
        """SIGKILL the worker (KILL) or the whole group of the supervisor (GROUP, a fresh
        one started as systemd would) of a big job mid-run; None if none is."""
        self.fleet.check_alive()
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True, connect_timeout=3) as db:
                held = db.execute(HELD.format(s=self.workload.schema), (PAUSE / 2,)).fetchone()
        except psycopg.OperationalError:
            return None
        if held is None:
            return None
        pid = owner_process(held[2])[1]
        sup = next((s for s in self.fleet.procs if pid in s.workers()), None)
        if sup is None:
            return None  # it moved on meanwhile
        if not kill_mid_run(self.workload, self.fleet, sup, pid, held[1], group=fault != KILL):
            return None  # it ended before it stood still
        return Aim(fault, held[0], held[1])


# -- what the run left ---------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: int
    account: str
    state: str
    attempts: int
    turn: float | None
    enqueued: dt.datetime  # created_at: its insert's transaction began


@dataclass
class Record:
    """Everything the checks read, once every job finished."""

    jobs: dict[int, Job]
    runs: dict[str, tuple[int, int, dt.datetime, dt.datetime | None]]  # job, attempt, start, end
    first: dict[int, dt.datetime]  # each job's first run's start
    effects: dict[int, list[int]]  # job: the attempts whose effect committed


def read(workload: Workload) -> Record:
    s = workload.schema
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        rows = db.execute(
            f"SELECT id, args->>'account', state::text, attempts, fair_turn, created_at"
            f" FROM {s}.jobs"
        ).fetchall()
        runs = db.execute(f"SELECT token, job_id, attempt, started, ended FROM {s}.runs").fetchall()
        effects = db.execute(f"SELECT job_id, attempt FROM {s}.effects").fetchall()
    jobs = {r[0]: Job(*r) for r in rows}
    rec = Record(jobs, {r[0]: r[1:] for r in runs}, {}, defaultdict(list))
    for job_id, _, started, _ in sorted(rec.runs.values(), key=lambda r: r[2]):
        rec.first.setdefault(job_id, started)
    for job_id, attempt in effects:
        rec.effects[job_id].append(attempt)
    return rec


@dataclass(frozen=True)
class Wait:
    """What one small key's job waited for: the big jobs not started at its enqueue
    (`backlog`), and those of them that started before it (`ahead`)."""

    job: int
    ahead: int
    backlog: int


def waits(rec: Record, small: list[int]) -> list[Wait]:
    big = [rec.first[j.id] for j in rec.jobs.values() if j.account == "big"]
    found = []
    for job in small:
        since, start = rec.jobs[job].enqueued, rec.first[job]
        later = [t for t in big if t > since]
        found.append(Wait(job, sum(1 for t in later if t < start), len(later)))
    return found


def finished_once(rec: Record, workload: Workload) -> list[str]:
    """Every job succeeded, its effect committed once, by its last attempt."""
    found = workload.verdict().problems
    found += [f"job {j.id}: {j.state}" for j in rec.jobs.values() if j.state != "succeeded"]
    found += [
        f"job {j.id}: effects of attempts {rec.effects.get(j.id)}, {j.attempts} attempts"
        for j in rec.jobs.values()
        if rec.effects.get(j.id) != [j.attempts]
    ]
    return found


def none_early(rec: Record) -> list[str]:
    """No run began before its job was enqueued; every job ran."""
    found = [f"job {j}: never ran" for j in rec.jobs if j not in rec.first]
    found += [
        f"job {job} attempt {attempt} began at {start.time()}, before its enqueue at"
        f" {rec.jobs[job].enqueued.time()}"
        for job, attempt, start, _ in rec.runs.values()
        if start <= rec.jobs[job].enqueued
    ]
    return found


def turns_kept(rec: Record, turns: dict[int, float]) -> list[str]:
    """Each job ended with the turn dealt at its enqueue, those given back due now by a
    fault too; or with none, if a fault's retry gave it back due later (a backoff:
    migration 0023 takes the turn of a job that waits for its time), and then it ran
    again (more than one attempt). The big key's turns are one apart."""
    found = [
        f"job {j.id} ({j.account}, {j.attempts} attempts): turn {turns.get(j.id)} at"
        f" enqueue, {j.turn} now"
        for j in rec.jobs.values()
        if (j.turn is None and j.attempts < 2) or (j.turn is not None and j.turn != turns.get(j.id))
    ]
    big = sorted(turns[j.id] for j in rec.jobs.values() if j.account == "big")
    if big != [big[0] + n for n in range(len(big))]:
        found.append(f"the big key's turns are not one apart: {big[:5]}..")
    return found


def aims_landed(rec: Record, aims: list[Aim]) -> list[str]:
    """Each kill landed mid-run: the run it hit never ended, and its job ran again (and
    committed once: finished_once)."""
    found = []
    for aim in aims:
        job, _, start, end = rec.runs[aim.run]
        again = [r for r in rec.runs.values() if r[0] == job and r[2] > start]
        if end is not None or not again:
            found.append(f"{aim}: ended {end}, {len(again)} runs after it")
    return found


# -- the test ------------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_small_keys_are_not_held_up_by_a_big_backlog_under_faults(
    workload: Workload, fair_fleet: Fleet, injector: Injector, producer: forklift.App
) -> None:
    fair_fleet.start(SUPERVISORS)
    fair_fleet.wait_ready()
    started = time.monotonic()
    run = Run(workload, fair_fleet, injector, producer)
    run.enqueue([render("big", f"big-{i}") for i in range(BIG)])
    running = "SELECT count(*) FROM {s}.jobs WHERE state = 'running'"
    wait_for(lambda: (workload.scalar(running) or 0) >= SLOTS, 30, 0.01, "every slot busy")
    run.play()
    played = time.monotonic() - started
    workload.wait_finished(timeout=120, check=fair_fleet.procs)
    fair_fleet.check_alive()
    rec = read(workload)
    found = waits(rec, run.small)
    print(
        f"{len(rec.jobs)} jobs in {time.monotonic() - started:.1f} s (plan {played:.1f} s);"
        f" K = {K}; big jobs ahead of each small one / still to start at its enqueue:"
        f" {[(w.ahead, w.backlog) for w in found]}; faults: {run.done}"
    )
    for problems in (
        finished_once(rec, workload), none_early(rec), turns_kept(rec, run.turns),
        aims_landed(rec, run.aims),
    ):  # fmt: skip
        assert problems == [], f"{problems[:10]}\n{fair_fleet.output()[-3000:]}"
    assert [w for w in found if w.ahead > K] == [], found
    # Served in line order, each would have waited for its whole backlog: many times K.
    assert min(w.backlog for w in found) >= 5 * K, found
    kills = [a for a in run.aims if a.fault == KILL]
    assert len(kills) == 4 and len(run.done) == 6, run.done
    supervisors = {liveness_holder(o) for (o,) in _ran_by(workload)}
    assert len(supervisors) >= SUPERVISORS + 1, supervisors  # the replacement's too


def _ran_by(workload: Workload) -> list[tuple[str]]:
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        return db.execute(
            f"SELECT DISTINCT ran_by FROM {workload.schema}.jobs WHERE ran_by IS NOT NULL"
        ).fetchall()
