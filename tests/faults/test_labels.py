"""Worker labels under real faults (issue 40): three `forklift run` supervisors of this
module's app (APP), one without labels, one with FORKLIFT_LABELS=gpu and one with
gpu,model-x, run the jobs of three tasks, `render` (requires gpu), `infer` (requires gpu
and model-x) and `plain` (any worker), enqueued in waves, while workers are SIGKILLed
mid-job, labelled ones running labelled jobs among them (their supervisor fails the
job: ready again, for a worker with the labels), the whole process group of a labelled
supervisor is killed mid-job, each twice (a fresh one started in its place, as systemd
would), and the database restarts. A group's jobs are lost, their supervisor dead with
them: charged by a peer supervisor that finds their worker's liveness lock free, or
taken back by a claim once their leases ran out, whichever comes first. The leases are
1 s (not the other fault tests' 3 s) so that both happen: a lease runs out about when a
peer's look for vanished workers (1 s, and a round) charges the job; and the workers
that lack the labels are kept busy (PER_WAVE), so claiming and looking for expired
leases as often as the others. A share of the labelled jobs is enqueued by a producer
that does not declare the tasks, so stores no labels: a worker without the labels that
claims one must give it back unrun. The one-process cases are in
tests/integration/test_labels.py.

Whatever is done to them: every job succeeded, its effect committed once, by its last
attempt; every kill landed mid-run, its attempt ended as the kill's (failed by its
supervisor, or lost) and its job ran again; and no job ran on a worker without the
labels its task requires. That is checked on what ran, not on what a claim meant: every
handler that began (`runs`, written at its start on a connection of its own, so killed
runs too) and every effect (written in ctx.transaction(), with the job's completion)
records the labels of the worker running it (FORKLIFT_LABELS, which its supervisor's CLI
read) and its supervisor (the worker's session: each supervisor is started in a session
of its own, which its workers stay in), which must be one started with those labels.
A worker also checks what it claimed (a job stored without the labels its task requires
is given back unrun), which would hide a claim that took a job for the wrong worker: so
the jobs workers gave back so (their logs) must all be ones stored without labels.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import os
import re
import time
import uuid
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
from tests.acceptance.proxy import Proxy
from tests.apps._recording import write
from tests.faults.harness import Aim, Fleet, Workload, kill_mid_run
from tests.faults.injector import Fault, Injector

# -- the app (run by the supervisors as APP) -----------------------------------------------

APP = "tests.faults.test_labels:app"
# The labels each task requires.
REQUIRES: dict[str, frozenset[str]] = {
    "render": frozenset({"gpu"}),
    "infer": frozenset({"gpu", "model-x"}),
    "plain": frozenset(),
}
# Each supervisor's labels (its FORKLIFT_LABELS, sorted).
NONE, GPU, MODEL = "", "gpu", "gpu,model-x"
LABELS = (NONE, GPU, MODEL)
# Short backoffs and room for the faults: a kill costs the job it hits an attempt and a
# crash, a database restart an attempt to each job running through it.
QUICK = forklift.Backoff(base=0.05, factor=2.0, max=0.5, jitter=0.0)
ATTEMPTS, CRASHES = 20, 10
PAUSE = 0.1  # seconds each run sleeps before its effect: the window of a kill

TABLES = """
CREATE TABLE {schema}.runs (
    token      text PRIMARY KEY,        -- one run (a retried insert of it is one row)
    job_id     bigint NOT NULL,
    attempt    integer NOT NULL,
    task       text NOT NULL,
    labels     text NOT NULL,           -- its worker's FORKLIFT_LABELS
    supervisor integer NOT NULL,        -- its worker's session: its supervisor's pid
    pid        integer NOT NULL,
    pause      float8 NOT NULL,         -- seconds it sleeps before its effect
    started    timestamptz NOT NULL,    -- the handler's start (database clock)
    ended      timestamptz              -- the handler's end; NULL: killed, or not written
);
ALTER TABLE {schema}.effects ADD COLUMN labels text, ADD COLUMN supervisor integer;
"""


def _run(app: forklift.App, ctx: forklift.JobContext, task: str, key: str, pause: float) -> str:
    """Record the run's start with its worker's labels and supervisor (a run that cannot
    does nothing else and fails: every run that did anything is seen), sleep `pause`,
    commit the effect keyed `key`, the labels and supervisor with it."""
    schema, token = app.schema, uuid.uuid4().hex
    labels, supervisor = os.environ.get("FORKLIFT_LABELS", ""), os.getsid(0)
    write(
        app,
        "labels-runs",
        f"INSERT INTO {schema}.runs (token, job_id, attempt, task, labels, supervisor, pid,"
        f" pause, started) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, clock_timestamp())"
        f" ON CONFLICT (token) DO NOTHING",
        (token, ctx.job_id, ctx.attempt, task, labels, supervisor, os.getpid(), pause),
    )
    time.sleep(pause)  # the window in which a test kills it
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {schema}.effects (key, job_id, attempt, labels, supervisor)"
            f" VALUES (%s, %s, %s, %s, %s)",
            (key, ctx.job_id, ctx.attempt, labels, supervisor),
        )
    # An end not written (the database away) leaves the run open.
    try:
        ended = f"UPDATE {schema}.runs SET ended = clock_timestamp() WHERE token = %s"
        write(app, "labels-runs", ended, (token,))
    except psycopg.Error:
        pass
    return key


def declare(app: forklift.App) -> None:
    """Declare `render`, `infer` and `plain` on `app`, each requiring its REQUIRES."""

    def options(task: str) -> forklift.TaskOptions:
        return {
            "max_attempts": ATTEMPTS,
            "max_crashes": CRASHES,
            "backoff": QUICK,
            "requires": REQUIRES[task],
        }

    @app.task(name="render", **options("render"))
    def render(ctx: forklift.JobContext, *, key: str, pause: float) -> str:
        return _run(app, ctx, "render", key, pause)

    @app.task(name="infer", **options("infer"))
    def infer(ctx: forklift.JobContext, *, key: str, pause: float) -> str:
        return _run(app, ctx, "infer", key, pause)

    @app.task(name="plain", **options("plain"))
    def plain(ctx: forklift.JobContext, *, key: str, pause: float) -> str:
        return _run(app, ctx, "plain", key, pause)


app = forklift.App()
declare(app)

# -- the test's plan -----------------------------------------------------------------------

WORKERS = 2  # per supervisor, concurrency 1 each
LEASE = 1.0  # seconds (the module docstring says why not 3)
KILL, GROUP, RESTART = "kill worker", "kill group", "db restart"
# Each fault, and the job it is aimed at: of which task, on a supervisor with which labels.
PLAN: tuple[tuple[str, str, str], ...] = (
    (KILL, "render", GPU), (KILL, "infer", MODEL), (KILL, "plain", NONE),
    (RESTART, "", ""),
    (GROUP, "render", GPU), (KILL, "render", MODEL), (GROUP, "infer", MODEL),
    (KILL, "render", GPU), (GROUP, "infer", MODEL), (GROUP, "render", GPU),
)  # fmt: skip
# Jobs of each task enqueued before each fault, and after the last. Plain ones the most:
# they keep the workers that lack labels busy, so claiming (and scanning for expired
# leases) every half lease, not idle and polling every 2 s, when a group's lost jobs'
# leases run out: a claim of theirs that took one would be seen.
PER_WAVE = {"render": 12, "infer": 12, "plain": 36}
UNDECLARED = 3  # every third labelled job of a wave is enqueued without its labels


@pytest.fixture
def label_fleets(workload: Workload, tmp_path: Path) -> Iterator[dict[str, Fleet]]:
    """A fleet of supervisors of APP for each of LABELS (none started yet), its tables in
    the schema. They connect to the cluster directly: no fault here is the network's."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(TABLES.format(schema=workload.schema))
    args = ["--workers", str(WORKERS), "--lease", f"{LEASE:g}s", "--grace", "5s"]
    fleets = {}
    for labels in LABELS:
        logs = tmp_path / (labels or "none")
        logs.mkdir()
        fleet = Fleet.for_workload(workload, logs, args, app=APP)
        fleet.env["FORKLIFT_LABELS"] = labels  # read by the CLI, and by the handlers
        fleets[labels] = fleet
    yield fleets
    for fleet in fleets.values():
        fleet.kill()


@pytest.fixture
def injector(
    cluster: Cluster, proxy: Proxy, label_fleets: dict[str, Fleet], workload: Workload
) -> Injector:
    return Injector(cluster, proxy, label_fleets[NONE], workload, lease=LEASE)


@pytest.fixture
def producer(workload: Workload) -> Iterator[forklift.App]:
    """An app that declares the tasks, so its enqueues store the labels each requires."""
    found = forklift.App(workload.dsn, schema=workload.schema)
    declare(found)
    yield found
    found.close()


def wave(n: int) -> tuple[list[forklift.JobSpec], list[forklift.JobSpec]]:
    """Wave `n`: PER_WAVE jobs of each task, the tasks taking turns (so that the gpu,model-x
    workers take render jobs too); (declared, undeclared): every UNDECLARED-th labelled
    job is for the producer that does not declare the tasks (its key begins "bare-")."""
    declared: list[forklift.JobSpec] = []
    undeclared: list[forklift.JobSpec] = []
    for i, task in itertools.product(range(max(PER_WAVE.values())), sorted(REQUIRES)):
        if i >= PER_WAVE[task]:
            continue
        bare = bool(REQUIRES[task]) and i % UNDECLARED == 0
        args = {"key": f"{'bare' if bare else 'own'}-{task}-{n}-{i}", "pause": PAUSE}
        spec = forklift.JobSpec(task, args, max_attempts=ATTEMPTS, max_crashes=CRASHES)
        (undeclared if bare else declared).append(spec)
    return declared, undeclared


# -- the run -------------------------------------------------------------------------------


# The runs of `task` mid-run on workers with `labels`: begun 10 ms ago or more, with at
# least half their pause left.
HELD = """
SELECT j.id, r.token, j.lease_owner FROM {s}.jobs AS j
JOIN {s}.runs AS r ON r.job_id = j.id AND r.attempt = j.attempts
WHERE j.state = 'running' AND j.task = %s AND r.labels = %s AND r.ended IS NULL
  AND r.started < clock_timestamp() - interval '10 ms'
  AND r.started > clock_timestamp() - make_interval(secs => r.pause / 2)
ORDER BY r.started DESC
"""
# Whether the job of run `token` ran again since.
AGAIN = """
SELECT EXISTS (SELECT 1 FROM {s}.runs AS r, {s}.runs AS hit
               WHERE hit.token = %s AND r.job_id = hit.job_id AND r.started > hit.started)
"""
# Whether a run began since `since` on `n` supervisors or more.
RESUMED = "SELECT count(DISTINCT supervisor) >= %s FROM {s}.runs WHERE started > %s"


@dataclass
class Faults:
    """Plays PLAN: before each fault a wave of jobs; each kill aimed at a job mid-run on
    a supervisor with the labels it names; after it, until its job ran again (after a
    restart: until every supervisor ran a job since)."""

    workload: Workload
    fleets: dict[str, Fleet]
    injector: Injector
    producer: forklift.App
    waves: int = 0
    aims: list[Aim] = field(default_factory=list)
    done: list[str] = field(default_factory=list)

    def play(self) -> None:
        for fault, task, labels in PLAN:
            self.enqueue()
            if fault == RESTART:
                since = self.workload.scalar("SELECT clock_timestamp()")
                self.done.append(f"{fault} {self.injector.inject(Fault.DB_RESTART).detail}")
                resumed = functools.partial(self.workload.scalar, RESUMED, len(LABELS), since)
                wait_for(resumed, 30, 0.02, f"work on every supervisor after {fault}")
                continue
            what = f"{task} mid-run on [{labels}] for {fault}"
            aim = wait_for(functools.partial(self._kill, fault, task, labels), 30, 0.005, what)
            self.aims.append(aim)
            self.done.append(f"{fault} [{labels}] {task} job {aim.job_id}")
            again = functools.partial(self.workload.scalar, AGAIN, aim.run)
            wait_for(again, 30, 0.02, f"job {aim.job_id} run again after {fault}")
        self.enqueue()

    def enqueue(self) -> None:
        """The next wave, by both producers."""
        declared, undeclared = wave(self.waves)
        self.waves += 1
        self.producer.enqueue_many(declared)
        self.workload.app.enqueue_many(undeclared)  # a producer only: it declares no task

    def check_alive(self) -> None:
        for fleet in self.fleets.values():
            fleet.check_alive()

    def _kill(self, fault: str, task: str, labels: str) -> Aim | None:
        """SIGKILL the worker (KILL) or the whole group of the supervisor (GROUP, a fresh
        one started as systemd would) of a `task` job mid-run on a supervisor of `labels`;
        None if none is, or if it ended before its worker stood still."""
        self.check_alive()
        fleet = self.fleets[labels]
        owners = {pid: sup for sup in fleet.procs for pid in sup.workers()}
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True, connect_timeout=3) as db:
                held = db.execute(HELD.format(s=self.workload.schema), (task, labels)).fetchall()
        except psycopg.OperationalError:
            return None
        for job_id, run, owner in held:
            pid = owner_process(owner)[1]
            sup = owners.get(pid)
            if sup is None:
                continue  # a worker started since, or one of a supervisor killed before
            if not kill_mid_run(self.workload, fleet, sup, pid, run, group=fault == GROUP):
                return None  # it ended before it stood still
            return Aim(fault, job_id, run)
        return None


# -- what the run left ---------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: int
    task: str
    key: str
    state: str
    attempts: int
    errors: list[dict[str, Any]]


@dataclass(frozen=True)
class Ran:
    """A run (its handler began) or an effect (its commit): whose, and on which worker."""

    job_id: int
    attempt: int
    labels: str
    supervisor: int


@dataclass
class Record:
    """Everything the checks read, once every job finished."""

    jobs: dict[int, Job]
    runs: dict[str, tuple[Ran, Any, Any]]  # token: the run, its start, its end
    effects: list[Ran]


def read(workload: Workload) -> Record:
    s = workload.schema
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        jobs = db.execute(
            f"SELECT id, task, args->>'key', state::text, attempts, errors FROM {s}.jobs"
        ).fetchall()
        runs = db.execute(
            f"SELECT token, job_id, attempt, labels, supervisor, started, ended FROM {s}.runs"
        ).fetchall()
        effects = db.execute(
            f"SELECT job_id, attempt, labels, supervisor FROM {s}.effects"
        ).fetchall()
    return Record(
        {j[0]: Job(*j) for j in jobs},
        {r[0]: (Ran(*r[1:5]), r[5], r[6]) for r in runs},
        [Ran(*e) for e in effects],
    )


def finished_once(rec: Record, workload: Workload) -> list[str]:
    """Every job succeeded, its effect committed once, by its last attempt."""
    found = workload.verdict().problems
    found += [f"job {j.id}: {j.state}" for j in rec.jobs.values() if j.state != "succeeded"]
    effects: dict[int, list[int]] = defaultdict(list)
    for effect in rec.effects:
        effects[effect.job_id].append(effect.attempt)
    found += [
        f"job {j.id}: effects of attempts {effects.get(j.id)}, {j.attempts} attempts"
        for j in rec.jobs.values()
        if effects.get(j.id) != [j.attempts]
    ]
    found += [f"effects of job {j}, not a job" for j in effects if j not in rec.jobs]
    return found


def labelled_only(rec: Record, fleets: dict[str, Fleet]) -> list[str]:
    """Every run that began and every effect committed was on a worker with every label
    its job's task requires, of a supervisor started with the labels it recorded."""
    started = {
        labels: {sup.pid for sup in [*fleet.procs, *fleet.retired]}
        for labels, fleet in fleets.items()
    }
    found = []
    for what, ran in [*(("run", r) for r, _, _ in rec.runs.values()),
                      *(("effect", e) for e in rec.effects)]:  # fmt: skip
        task = rec.jobs[ran.job_id].task
        has = set(ran.labels.split(",")) - {""}
        if not REQUIRES[task] <= has:
            found.append(
                f"{what} of {task} job {ran.job_id} attempt {ran.attempt} on [{ran.labels}]"
            )
        if ran.supervisor not in started.get(ran.labels, set()):
            found.append(
                f"{what} of job {ran.job_id} on [{ran.labels}] under supervisor"
                f" {ran.supervisor}, not one started with them: {started}"
            )
    return found


def ended_as(rec: Record, aim: Aim) -> str:
    """How the attempt a kill hit ended, as its job's errors say: its error's kind
    (WorkerDied, WorkerLost, LeaseExpired); "" if none was recorded."""
    hit, start, _ = rec.runs[aim.run]
    kinds = [
        str(e.get("error")).split(":")[0] for e in rec.jobs[aim.job_id].errors
        if e.get("attempt") == hit.attempt and dt.datetime.fromisoformat(e["at"]) >= start
    ]  # fmt: skip
    return kinds[0] if kinds else ""


# A kill's job is failed by its supervisor; a group's is lost, its supervisor dead with
# it: charged by a peer supervisor that found its worker's liveness lock free, or taken
# back by a claim once its lease ran out.
ENDED_AS = {KILL: {"WorkerDied"}, GROUP: {"WorkerLost", "LeaseExpired"}}


def aims_landed(rec: Record, aims: list[Aim]) -> list[str]:
    """Each kill landed mid-run: the run it hit never ended, its attempt ended as the
    kill's (ENDED_AS), and its job ran again."""
    found = []
    for aim in aims:
        hit, start, end = rec.runs[aim.run]
        again = [r for r, s, _ in rec.runs.values() if r.job_id == hit.job_id and s > start]
        if end is not None or not again or ended_as(rec, aim) not in ENDED_AS[aim.fault]:
            found.append(
                f"{aim}: ended {end}, {len(again)} runs after it, attempt ended as"
                f" {ended_as(rec, aim)!r}: {rec.jobs[aim.job_id].errors}"
            )
    return found


MISPLACED = re.compile(r"worker\.jobs_misplaced jobs=\[([\d, ]*)\]")


def misplaced(output: str) -> set[int]:
    """The jobs workers gave back unrun, their task requiring labels they lack (their logs)."""
    found = (i for m in MISPLACED.finditer(output) for i in m[1].split(","))
    return {int(i) for i in found if i.strip()}


def claims_kept(rec: Record, given_back: set[int]) -> list[str]:
    """No claim took a job stored with its labels for a worker without them: the jobs a
    worker gave back unrun for want of labels (its own check, which would keep such a
    claim from showing in labelled_only) are all ones stored without them."""
    return [
        f"{rec.jobs[j].task} job {j}, stored with its labels, claimed by a worker without them"
        for j in sorted(given_back)
        if not rec.jobs[j].key.startswith("bare-")
    ]


# -- the test ------------------------------------------------------------------------------

REGISTERED = """
SELECT pid, array_to_string(labels, ',') FROM {s}.processes WHERE kind = 'supervisor'
"""


@pytest.mark.timeout(150)
def test_no_job_runs_on_a_worker_without_its_labels_under_faults(
    workload: Workload,
    label_fleets: dict[str, Fleet],
    injector: Injector,
    producer: forklift.App,
) -> None:
    for fleet in label_fleets.values():
        fleet.start()
    for fleet in label_fleets.values():
        fleet.wait_ready()
    # Each supervisor runs with the labels it was given (its CLI read FORKLIFT_LABELS).
    expected = {fleet.procs[0].pid: labels for labels, fleet in label_fleets.items()}

    def registered() -> bool:
        with psycopg.connect(workload.dsn, autocommit=True) as db:
            return dict(db.execute(REGISTERED.format(s=workload.schema)).fetchall()) == expected

    wait_for(registered, 20, 0.05, f"the supervisors registered with their labels {expected}")
    started = time.monotonic()
    faults = Faults(workload, label_fleets, injector, producer)
    faults.play()
    procs = [sup for fleet in label_fleets.values() for sup in fleet.procs]
    workload.wait_finished(timeout=60, check=procs)
    faults.check_alive()
    rec = read(workload)
    by = Counter((r.labels, rec.jobs[r.job_id].task) for r, _, _ in rec.runs.values())
    output = "\n".join(fleet.output() for fleet in label_fleets.values())
    given_back = misplaced(output)
    bare = {j.id for j in rec.jobs.values() if j.key.startswith("bare-")}
    print(
        f"{len(rec.jobs)} jobs, {len(rec.runs)} runs in {time.monotonic() - started:.1f} s;"
        f" runs by [labels] and task: {dict(by)}; {len(given_back & bare)} of {len(bare)}"
        f" jobs stored without their labels given back unrun by a worker without them;"
        f" faults: {faults.done}, the attempts killed ended as"
        f" {[ended_as(rec, a) for a in faults.aims]}"
    )
    for problems in (
        finished_once(rec, workload), labelled_only(rec, label_fleets),
        aims_landed(rec, faults.aims), claims_kept(rec, given_back),
    ):  # fmt: skip
        assert problems == [], f"{len(problems)}: {problems[:10]}\n{output[-3000:]}"
    assert len(rec.jobs) == faults.waves * sum(PER_WAVE.values()), len(rec.jobs)
    assert len(faults.aims) == len(PLAN) - 1 and len(faults.done) == len(PLAN), faults.done
    # Each supervisor ran its share: plain jobs on the unlabelled one, render jobs on both
    # labelled ones (each has gpu), infer ones on gpu,model-x.
    assert {(NONE, "plain"), (GPU, "render"), (MODEL, "render"), (MODEL, "infer")} <= set(by)
    assert given_back & bare, "no worker without the labels claimed a job stored without them"
