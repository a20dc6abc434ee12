"""Unique jobs under real faults (issue 40, invariant 29): three `forklift run` supervisors
of tests/apps/unique.py run two unique tasks while four producer threads enqueue over a
few keys, one by one (keep, replace, raise) and in bulk (keep, replace), so that most
enqueues meet a live job of their key; meanwhile workers are SIGKILLed mid-job, one
supervisor's whole process group is killed (a fresh one started in its place) and the
database restarts (the producers retry the calls it fails, and count them). Whatever is
done to them: no unique key ever had two jobs in its states at once, every enqueue
returned a job of its task and key that held the key during the call, every job stored
its key and ended succeeded with its effect committed once, by its last attempt, and
every kill landed mid-run. The one-process cases are in tests/integration/test_unique.py.

Why "never two at once" is checked soundly. A trigger of the test (tests/apps/unique.py,
TABLES) writes a row for every change of a job's state at the commit of the transaction
that made it: a change rolled back (an insert that met the index, a completion the
restart cut) leaves none, and every committed one has one. Each such transaction takes
a commit number under an exclusive lock that PostgreSQL releases only once its commit is
visible (a transaction's locks go after it has left the proc array), and the next takes
its number after that: the numbers order these transactions as every snapshot sees
them, and a snapshot sees a prefix of them. Replayed in that order, a transaction at a
time (no one sees the middle of one), the moves pass through every state of the unique
jobs that a reader could have seen, and through no other. The moves' clock times would
not do: a statement's time is not its commit's, and a release whose statement came
first may commit after an insert's. The lock serializes only these commits, not the
statements before them: an insert races another's uncommitted insert or release as it
would without it, and meets the index or waits on it.

Why "returned a job that held the key" is checked soundly. Each call is bracketed by two
marks (`unique_mark()`, under the same lock): the number of the last of those
transactions to have committed before the call, and before its return. Whatever the
call's statements saw of the jobs (a snapshot, or the index's look at the latest
committed rows) was the state after one of the prefixes between the two, so the job it
returned (inserted, met, replaced, or raised with) held its key in the replay at some
prefix between the marks: it took the key by the second and had not given it up by the
first.

Run it once with FORKLIFT_TEST_UNIQUE_INDEX=off (migration 0022's index dropped in the
test's schema) to see it fail.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift._ids import owner_process
from forklift.embedded import Cluster
from forklift.testing import wait_for
from forklift.unique import OnConflict
from tests.acceptance.proxy import Proxy
from tests.apps.unique import declare, tables
from tests.faults.harness import Aim, Fleet, Workload, kill_mid_run
from tests.faults.injector import Fault, Injector

APP = "tests.apps.unique:app"
SUPERVISORS, WORKERS = 3, 2
KEYS = {"sync": 6, "ping": 3}  # each task's keys: few, so that enqueues keep meeting jobs
PRODUCERS = 4  # the even ones enqueue one by one, the odd ones in bulk
KILL, GROUP, RESTART = "kill worker", "kill group", "db restart"
PLAN = (KILL, KILL, GROUP, KILL, RESTART, KILL)
BETWEEN = 60  # jobs that succeed before the first fault, after each, and after the last


@pytest.fixture
def unique_fleet(workload: Workload, tmp_path: Path) -> Iterator[Fleet]:
    """Supervisors of tests/apps/unique.py (none started yet), its tables in the schema.
    They connect to the cluster directly: no fault here is the network's."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(tables(workload.schema))
    args = ["--workers", str(WORKERS), "--lease", "3s", "--grace", "5s"]
    fleet = Fleet.for_workload(workload, tmp_path, args, app=APP)
    yield fleet
    fleet.kill()


@pytest.fixture
def injector(cluster: Cluster, proxy: Proxy, unique_fleet: Fleet, workload: Workload) -> Injector:
    return Injector(cluster, proxy, unique_fleet, workload, lease=3.0)


@pytest.fixture
def producers(workload: Workload) -> Iterator[Producers]:
    """The producer threads (not started yet), on an app that declares the unique tasks
    (so its enqueues draw each job's key); stopped at the end whatever happened."""
    app = forklift.App(workload.dsn, schema=workload.schema)
    declare(app)
    found = Producers(app)
    yield found
    found.finish()
    app.close()


# -- the producers -------------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One enqueue that returned (or raised UniqueConflict): the marks around it, and for
    each job it asked for, its task, key and the id it was given."""

    before: int
    after: int
    jobs: tuple[tuple[str, str, int], ...]
    bulk: bool


@dataclass
class Producers:
    """PRODUCERS threads enqueueing over KEYS until stopped, each call between two marks;
    a transient database error is retried and noted in `retried` (what failed, and why),
    any other error ends the thread."""

    app: forklift.App
    calls: list[Call] = field(default_factory=list)
    retried: list[str] = field(default_factory=list)
    errors: list[BaseException] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i in range(PRODUCERS):
            thread = threading.Thread(target=self._produce, args=(i % 2 == 1, i), daemon=True)
            self.threads.append(thread)
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=30)

    def _produce(self, bulk: bool, seed: int) -> None:
        rng, counter = random.Random(seed), itertools.count()
        try:
            with Marks(self.app.dsn, self.app.schema, self) as marks:
                while not self.stop.is_set():
                    call = self._call(rng, counter, bulk, marks)
                    if call is not None:
                        self.calls.append(call)
        except BaseException as exc:  # reported by the test
            self.errors.append(exc)

    def _call(
        self, rng: random.Random, counter: Iterator[int], bulk: bool, marks: Marks
    ) -> Call | None:
        """One enqueue between two marks; None if the database failed it (counted)."""
        policies: list[OnConflict] = ["keep", "replace"] if bulk else ["keep", "replace", "raise"]
        count = rng.randint(1, 8) if bulk else 1
        specs = [spec(rng, next(counter), rng.choice(policies)) for _ in range(count)]
        before = marks.take()
        try:
            if bulk:
                ids = self.app.enqueue_many(specs)
            else:
                (one,) = specs
                given = self.app.enqueue(
                    one.task, one.args, delay=one.delay, on_conflict=one.on_conflict
                )
                ids = [given]
        except forklift.UniqueConflict as conflict:
            ids = [conflict.job_id]
        except forklift.DatabaseError as exc:
            if not exc.transient:
                raise
            cause = exc.cause_class.__name__ if exc.cause_class else str(exc)[:60]
            self.retried.append(f"enqueue: {cause}")
            time.sleep(0.05)  # a pause before the next call, not a wait for an outcome
            return None
        jobs = tuple((s.task, s.args["key"], i) for s, i in zip(specs, ids, strict=True))
        return Call(before, marks.take(), jobs, bulk)


def spec(rng: random.Random, n: int, policy: OnConflict) -> forklift.JobSpec:
    """A job of a random task and key; half of them due a moment later (ready for longer:
    more for a replace to replace)."""
    task = rng.choice(sorted(KEYS))
    delay = rng.choice([None, None, 0.1, 0.3])
    args = {"key": f"{task}-{rng.randrange(KEYS[task])}", "n": n}
    return forklift.JobSpec(task, args, delay=delay, on_conflict=policy)


class Marks:
    """A producer thread's connection for its marks (tests/apps/unique.py: unique_mark)."""

    def __init__(self, dsn: str, schema: str, producers: Producers) -> None:
        self.dsn, self.schema, self.producers = dsn, schema, producers
        self.conn: psycopg.Connection[Any] | None = None

    def take(self) -> int:
        """The number of the last unique job's transaction committed; through an outage,
        once the database answers again (each failed try counted)."""
        deadline = time.monotonic() + 60
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=3)
                row = self.conn.execute(f"SELECT {self.schema}.unique_mark()").fetchone()
                assert row is not None
                return int(row[0])
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                self.producers.retried.append("mark: OperationalError")
                self.close()
                time.sleep(0.05)  # a pause before trying again, not a wait for an outcome

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(psycopg.Error):
                self.conn.close()
        self.conn = None

    def __enter__(self) -> Marks:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the faults ----------------------------------------------------------------------------


# A job mid-run: its run began 10 ms ago or more, and at least half its pause is left.
HELD = """
SELECT j.id, r.token, j.lease_owner FROM {s}.jobs AS j
JOIN {s}.runs AS r ON r.job_id = j.id AND r.attempt = j.attempts
WHERE j.state = 'running' AND r.ended IS NULL
  AND r.started < clock_timestamp() - interval '10 ms'
  AND r.started > clock_timestamp() - make_interval(secs => r.pause / 2)
ORDER BY r.started DESC LIMIT 1
"""
SUCCEEDED = "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'"


@dataclass
class Faults:
    """Plays PLAN on a fleet: each kill aimed at a job mid-run, then BETWEEN jobs more
    succeeded before the next fault."""

    workload: Workload
    fleet: Fleet
    injector: Injector
    aims: list[Aim] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def play(self) -> None:
        self.progress("the first fault")
        for fault in PLAN:
            if fault == RESTART:
                self.done.append(f"{fault} {self.injector.inject(Fault.DB_RESTART).detail}")
            else:
                aim = wait_for(
                    functools.partial(self._kill, fault), 30, 0.005, f"a job mid-run: {fault}"
                )
                self.aims.append(aim)
                self.done.append(f"{fault} job {aim.job_id}")
            self.progress(f"work after {fault}")

    def progress(self, what: str) -> None:
        """Until BETWEEN more jobs succeeded than now (the database back, if away)."""
        start = self.succeeded()

        def went_on() -> bool:
            self.fleet.check_alive()
            return bool((self.workload.scalar(SUCCEEDED) or 0) >= start + BETWEEN)

        wait_for(went_on, 60, 0.02, what)

    def succeeded(self) -> int:
        """How many jobs succeeded so far (once the database answers, if it is away)."""

        def counted() -> tuple[int] | None:
            n = self.workload.scalar(SUCCEEDED)
            return None if n is None else (int(n),)

        return int(wait_for(counted, 30, 0.05, "the database")[0])

    def _kill(self, fault: str) -> Aim | None:
        """SIGKILL the worker (KILL) or the whole group of the supervisor (GROUP, a fresh
        one started as systemd would) of a job mid-run; None if no job is, or if it ended
        before the victim stood still: this process's producer threads make each step of
        the aim wait for the GIL, and a run has some 25 ms left."""
        self.fleet.check_alive()
        owners = {pid: sup for sup in self.fleet.procs for pid in sup.workers()}
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True, connect_timeout=3) as db:
                held = db.execute(HELD.format(s=self.workload.schema)).fetchone()
        except psycopg.OperationalError:
            return None
        pid = 0 if held is None else owner_process(held[2])[1]
        sup = owners.get(pid)
        if held is None or sup is None:
            return None  # none mid-run, or it is a worker started since
        if not kill_mid_run(self.workload, self.fleet, sup, pid, held[1], group=fault != KILL):
            return None  # it ended before it stood still
        return Aim(fault, held[0], held[1])


# -- what the run left ---------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: int
    task: str
    key: str
    state: str
    attempts: int
    unique_key: str | None


@dataclass(frozen=True)
class Move:
    commit_n: int
    n: int
    job_id: int
    unique_key: str | None
    holds: bool


@dataclass
class Record:
    """Everything the checks read, once every job finished."""

    jobs: dict[int, Job]
    moves: list[Move]  # in commit order, and in order within each commit
    runs: dict[str, tuple[int, int, Any, Any]]  # token: job, attempt, start, end
    effects: dict[int, list[int]]  # job: the attempts whose effect committed


def read(workload: Workload) -> Record:
    s = workload.schema
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        jobs = db.execute(
            f"SELECT id, task, args->>'key', state::text, attempts, unique_key FROM {s}.jobs"
        ).fetchall()
        moves = db.execute(
            f"SELECT commit_n, n, job_id, unique_key, holds FROM {s}.unique_moves"
            " ORDER BY commit_n, n"
        ).fetchall()
        runs = db.execute(f"SELECT token, job_id, attempt, started, ended FROM {s}.runs")
        effects = db.execute(f"SELECT job_id, attempt FROM {s}.effects").fetchall()
        rec = Record({r[0]: Job(*r) for r in jobs}, [Move(*m) for m in moves],
                     {r[0]: r[1:] for r in runs}, defaultdict(list))  # fmt: skip
    for job_id, attempt in effects:
        rec.effects[job_id].append(attempt)
    return rec


def overlaps(moves: list[Move]) -> list[str]:
    """The keys that two jobs held at once: the moves replayed a commit at a time, in
    commit order (the module docstring says why that is every state a reader saw)."""
    holding: dict[str, set[int]] = defaultdict(set)
    found = []
    for commit_n, made in itertools.groupby(moves, key=lambda m: m.commit_n):
        touched = set()
        for move in made:
            if move.unique_key is None:
                continue  # reported by finished_once
            holders = holding[move.unique_key]
            if move.holds:
                holders.add(move.job_id)
            else:
                holders.discard(move.job_id)
            touched.add(move.unique_key)
        found += [
            f"commit {commit_n}: key {key[:12]}.. held by jobs {sorted(holding[key])}"
            for key in sorted(touched)
            if len(holding[key]) > 1
        ]
    return found


def spans(moves: list[Move]) -> dict[int, list[tuple[int, float]]]:
    """Each job's spans of holding its key, in commit numbers: from the commit that made
    it take the key to the one that made it give it up (inf: it holds it still)."""
    found: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for move in moves:
        held = found[move.job_id]
        is_open = bool(held) and held[-1][1] == math.inf
        if move.holds and not is_open:
            held.append((move.commit_n, math.inf))
        elif not move.holds and is_open:
            held[-1] = (held[-1][0], move.commit_n)
    return found


def answered(calls: list[Call], rec: Record, held: dict[int, list[tuple[int, float]]]) -> list[str]:
    """Each job a call was given is of the task and key it asked for, and held its key
    (`held`: spans()) at a commit between the call's marks: it took it by the second, and
    had not given it up by the first."""
    found = []
    for call in calls:
        for task, key, job_id in call.jobs:
            job = rec.jobs.get(job_id)
            if job is None or (job.task, job.key) != (task, key):
                found.append(f"{task} {key}: given job {job_id}, which is {job}")
            elif not any(took <= call.after and gave > call.before for took, gave in held[job_id]):
                found.append(
                    f"{task} {key}: given job {job_id}, holding its key over commits"
                    f" {held[job_id]}, not between {call.before} and {call.after}"
                )
    return found


def finished_once(rec: Record) -> list[str]:
    """Every job stored its unique key and succeeded, its effect committed once, by its
    last attempt."""
    found = [f"job {j.id}: stored no unique key" for j in rec.jobs.values() if j.unique_key is None]
    found += [f"job {j.id}: {j.state}" for j in rec.jobs.values() if j.state != "succeeded"]
    found += [
        f"job {j.id}: effects of attempts {rec.effects.get(j.id)}, {j.attempts} attempts"
        for j in rec.jobs.values()
        if rec.effects.get(j.id) != [j.attempts]
    ]
    found += [f"effects of job {j}, not a job" for j in rec.effects if j not in rec.jobs]
    return found


def aims_landed(rec: Record, aims: list[Aim]) -> list[str]:
    """Each kill landed mid-run: the run it hit never ended, and its job ran again."""
    found = []
    for aim in aims:
        job, _, start, end = rec.runs[aim.run]
        again = [r for r in rec.runs.values() if r[0] == job and r[2] > start]
        if end is not None or not again:
            found.append(f"{aim}: ended {end}, {len(again)} runs after it")
    return found


# -- the test ------------------------------------------------------------------------------


@pytest.mark.timeout(150)
def test_a_unique_key_never_has_two_live_jobs_under_faults(
    workload: Workload, unique_fleet: Fleet, injector: Injector, producers: Producers
) -> None:
    unique_fleet.start(SUPERVISORS)
    unique_fleet.wait_ready()
    started = time.monotonic()
    producers.start()
    faults = Faults(workload, unique_fleet, injector)
    faults.play()
    faults.progress("work after the last fault")
    producers.finish()
    assert producers.errors == [], producers.errors
    workload.wait_finished(timeout=60, check=unique_fleet.procs)
    unique_fleet.check_alive()
    rec = read(workload)
    calls, held = producers.calls, spans(rec.moves)
    # Jobs given that had taken their key before the call began: an enqueue that met one.
    met = sum(1 for c in calls for *_, j in c.jobs if any(t <= c.before for t, _ in held[j]))
    asked, bulk = sum(len(c.jobs) for c in calls), sum(c.bulk for c in calls)
    retried = Counter(producers.retried)
    print(
        f"{len(rec.jobs)} jobs, {len(calls)} calls ({bulk} bulk) asking for {asked} jobs,"
        f" {met} given one already there; retried {dict(retried)};"
        f" {len(rec.moves)} moves, in {time.monotonic() - started:.1f} s; faults: {faults.done}"
    )
    for problems in (
        overlaps(rec.moves), answered(calls, rec, held), finished_once(rec),
        aims_landed(rec, faults.aims),
    ):  # fmt: skip
        assert problems == [], f"{len(problems)}: {problems[:10]}\n{unique_fleet.output()[-3000:]}"
    assert retried, "the restart reached no producer"
    assert 0 < bulk < len(calls) and met > asked // 4, (bulk, met)  # keys met, not only taken
    per_key = {(j.task, j.key) for j in rec.jobs.values()}
    assert len(rec.jobs) > 3 * len(per_key)  # keys freed and taken again
    assert len(faults.aims) == len(PLAN) - 1 and len(faults.done) == len(PLAN), faults.done
