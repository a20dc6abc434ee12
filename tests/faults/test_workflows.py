"""Workflows under real faults: two `forklift run` supervisors of tests/apps/workflows.py
claiming at once run diamonds, a fan-in of 1,000 steps into one, a chain of 1,000 and
a graph that grows at run time, while workers are SIGKILLed mid-step, one supervisor's
whole process group is killed (and a fresh one started) and the database restarts.
Whatever is done to them, every step's effect commits once, no step starts before all
its upstream steps succeeded, every dependent is released exactly once (migration
0020's triggers, invariant 28), nothing is left blocked and every workflow succeeds. And
a concurrency limit holds for steps released together as for any job. The one-process
cases are in tests/integration/test_workflows.py.

Each fault is aimed: at a step in its hold (a step whose handler sleeps HOLD seconds,
or a scan growing its workflow), at least 0.1 s into it and with half of it left, so it
lands mid-handler: a killed step's attempt must not commit, and the step runs again.

Which times the checks trust (all on the database's clock: one server):

- A step's start is its handler's first statement (`runs.started`: clock_timestamp() on
  a connection of its own), recorded for every attempt, killed ones too. It comes after
  the claim committed, whose statement saw the step ready, which it was only once the
  transaction that completed the last of its upstream steps had committed.
- An upstream step's end is its effect row's `at`: clock_timestamp() inside its effect
  transaction, before the completion commits in it, so earlier than that commit.
  Every run of a step must start after every upstream step's end; a run that did is
  no proof of anything else, a run that did not is a real violation.
- Not trusted: `jobs.started_at` is now() of the claim's transaction, which may begin
  before the statement that saw the release (a claim carries the completions of its
  worker's last jobs), a prefetched job's handler starts long after it, and a later
  attempt overwrites it; `jobs.completed_at` is now() of the effect transaction, when
  the handler opened it, before its writes and its commit. Compared with each other,
  they prove nothing either way.

Released once: a trigger of the test (tests/apps/workflows.py, `moves`) records every
change of a workflow job's state in the transaction that made it, so a release that
rolled back leaves no row, and a job's rows come in the order its row lock gave them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
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
from tests.apps.workflows import ATTEMPTS, CRASHES, TABLES
from tests.faults.harness import Fleet, Workload
from tests.faults.injector import Fault, Injector
from tests.faults.test_limits import peaks, runs_of

APP = "tests.apps.workflows:app"
HOLD = 0.6  # seconds a hold step sleeps: the window a fault is aimed at
KILL, GROUP, RESTART = "kill worker", "kill group", "db restart"
# Over each run: several worker kills, a supervisor's group, a database restart.
PLAN = (KILL, KILL, GROUP, KILL, RESTART, KILL)
CHAIN = 1000


@pytest.fixture
def wf_fleet(workload: Workload, tmp_path: Path) -> Iterator[Fleet]:
    """Supervisors of tests/apps/workflows.py (none started yet), its tables in the
    schema. They connect to the cluster directly, not through the fault proxy: no fault
    here needs the network's, and the proxy adds some 40 ms to each wake-up of a worker
    (a release's NOTIFY, a claim's reply), which makes a chain, one wake-up a step, five
    times slower (12 ms a step directly, 64 through it)."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(TABLES.format(schema=workload.schema))
    fleet = Fleet.for_workload(
        workload, tmp_path, ["--workers", "2", "--lease", "3s", "--grace", "5s"], app=APP
    )
    yield fleet
    fleet.kill()


@pytest.fixture
def injector(cluster: Cluster, proxy: Proxy, wf_fleet: Fleet, workload: Workload) -> Injector:
    return Injector(cluster, proxy, wf_fleet, workload, lease=3.0)


def finished(wf: forklift.Workflow, timeout: float = 120.0) -> str:
    """The workflow's outcome once it finished, read by polling: wf.wait() would start
    this process's listener thread on the cluster's database, which outlives the test by
    its idle time (and tests that count this process's listeners would see it)."""
    wait_for(lambda: wf.status().finished_at is not None, timeout, 0.1, f"workflow {wf.id} done")
    return wf.status().state


# -- graphs --------------------------------------------------------------------------------


@dataclass
class Graph:
    """A workflow to enqueue, and the graph it must end as: each step's upstream steps
    by name (those a step adds as it runs included)."""

    wf: forklift.Workflow
    after: dict[str, set[str]] = field(default_factory=dict)

    def add(
        self,
        key: str,
        name: str,
        after: Sequence[forklift.Step] = (),
        pause: float = 0.0,
        task: str = "step",
    ) -> forklift.Step:
        """A step whose effect is keyed `key` and result is `key`."""
        self.after[name] = {s.name for s in after}
        return self.wf.add(
            task, {"key": key, "pause": pause}, after=after, name=name,
            max_attempts=ATTEMPTS, max_crashes=CRASHES,
        )  # fmt: skip


def diamonds(app: forklift.App, n: int, holds: Iterable[int]) -> list[Graph]:
    """`n` diamonds a -> b, c -> d; b holds in those of `holds`. b and c are claimed
    together, so their completions often commit at once on two workers."""
    found = []
    for i in range(n):
        g = Graph(app.workflow(name=f"diamond-{i}"))
        a = g.add(f"d{i}/a", "a")
        b = g.add(f"d{i}/b", "b", [a], HOLD if i in holds else 0.0)
        c = g.add(f"d{i}/c", "c", [a])
        g.add(f"d{i}/d", "d", [b, c])
        found.append(g)
    return found


def fan_in(app: forklift.App, n: int, holds: Iterable[int]) -> Graph:
    """`n` parts (those in `holds` hold), then `join` after all of them."""
    g = Graph(app.workflow(name="fan-in"))
    parts = [g.add(f"part-{i}", f"part-{i}", pause=HOLD if i in holds else 0.0) for i in range(n)]
    g.add("join", "join", parts)
    return g


def chain(app: forklift.App, n: int, holds: Iterable[int]) -> Graph:
    """`n` steps, each after the one before it."""
    g = Graph(app.workflow(name="chain"))
    previous: list[forklift.Step] = []
    for i in range(n):
        previous = [g.add(f"s{i}", f"s{i}", previous, HOLD if i in holds else 0.0)]
    return g


def growing(app: forklift.App, parts: int, holds: list[int]) -> Graph:
    """`scan`, which adds `parts` parts (tests/apps/workflows.py) and a merge after them
    as it runs, and `summary`, declared now after `scan` alone: it must wait for all
    that `scan` adds too."""
    g = Graph(app.workflow(name="grows"))
    args = {"key": "scan", "parts": parts, "every": 0.03, "holds": holds, "hold": HOLD}
    scan = g.wf.add("scan", args, name="scan", max_attempts=ATTEMPTS, max_crashes=CRASHES)
    g.add("summary", "summary", [scan])
    grown = {f"part-{n}" for n in range(parts)}
    g.after.update({"scan": set(), **{p: {"scan"} for p in grown}, "merge": {"scan", *grown}})
    g.after["summary"] |= {"merge", *grown}
    return g


# -- faults --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Aim:
    """A fault, and the step run it was aimed at (that attempt must not commit)."""

    fault: str
    job_id: int
    attempt: int
    pid: int


# A running step of the workflows in its hold (`pause`, or a scan's growth): 0.1 s into
# it, half of it still ahead, its run not ended, not aimed at before.
HELD = """
SELECT j.id, j.attempts, j.lease_owner FROM {s}.jobs AS j
JOIN {s}.runs AS r ON r.job_id = j.id AND r.attempt = j.attempts
WHERE j.workflow_id = ANY(%s) AND j.state = 'running' AND r.ended IS NULL
  AND NOT j.id = ANY(%s)
  AND r.started < clock_timestamp() - interval '0.1 s'
  AND r.started > clock_timestamp() - make_interval(secs => coalesce(
        (j.args->>'pause')::float8, (j.args->>'parts')::float8 * (j.args->>'every')::float8
      ) / 2)
ORDER BY r.started LIMIT 1
"""


class Faults:
    """Injects the faults of a plan into a fleet running `workflows`, each aimed at a
    step in its hold."""

    def __init__(
        self, workload: Workload, fleet: Fleet, injector: Injector, workflows: list[int]
    ) -> None:
        self.workload = workload
        self.fleet = fleet
        self.injector = injector
        self.workflows = workflows
        self.done: list[Aim] = []

    def run(self, plan: Sequence[str]) -> list[Aim]:
        for fault in plan:
            wait_for(functools.partial(self._aim, fault), 60, 0.02, f"a step held for {fault}")
        return self.done

    def _aim(self, fault: str) -> Aim | None:
        self.fleet.check_alive()
        left = self.workload.scalar(
            "SELECT count(*) FROM {s}.workflows WHERE id = ANY(%s) AND finished_at IS NULL",
            self.workflows,
        )
        assert left != 0, f"the workflows finished before {fault}; done: {self.done}"
        try:
            with psycopg.connect(self.workload.dsn, autocommit=True, connect_timeout=3) as db:
                held = db.execute(
                    HELD.format(s=self.workload.schema),
                    (self.workflows, [a.job_id for a in self.done]),
                ).fetchone()
        except psycopg.OperationalError:
            return None
        if held is None:
            return None
        pid = owner_process(held[2])[1]
        sup = next((s for s in self.fleet.procs if pid in s.workers()), None)
        if sup is None:
            return None  # it moved on meanwhile
        if fault == KILL:
            os.kill(pid, signal.SIGKILL)
        elif fault == GROUP:
            sup.kill_group()
            self.fleet.replace(sup)  # as systemd would
        else:
            self.injector.inject(Fault.DB_RESTART)  # fast or immediate (a crash)
        self.done.append(Aim(fault, held[0], held[1], pid))
        return self.done[-1]


# -- what the run left ---------------------------------------------------------------------


@dataclass(frozen=True)
class Job:
    id: int
    workflow_id: int
    step: str
    key: str
    state: str
    attempts: int
    waiting_on: int
    ran_by: str | None


@dataclass
class Record:
    """Everything the checks read, once the workflows finished."""

    workflows: list[tuple[int, str | None, int]]  # id, outcome, total
    jobs: dict[int, Job]
    upstream: dict[int, list[int]]  # job: the jobs it runs after
    effects: dict[int, list[tuple[int, dt.datetime, dict[str, Any]]]]  # attempt, at, seen
    runs: dict[int, list[tuple[int, dt.datetime, dt.datetime | None]]]  # attempt, start, end
    moves: dict[int, list[tuple[str, str, int]]]  # old, new, waiting_on: in order
    stray_effects: int  # effects of jobs not of these workflows


def read(workload: Workload, workflows: list[int]) -> Record:
    s = workload.schema
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        flows = db.execute(
            f"SELECT id, outcome, total FROM {s}.workflows WHERE id = ANY(%s)", (workflows,)
        ).fetchall()
        rows = db.execute(
            f"SELECT id, workflow_id, step, args->>'key', state::text, attempts, waiting_on,"
            f" ran_by FROM {s}.jobs WHERE workflow_id = ANY(%s)",
            (workflows,),
        ).fetchall()
        jobs = {r[0]: Job(*r) for r in rows}
        edges = db.execute(
            f"SELECT upstream, dependent FROM {s}.workflow_edges WHERE workflow_id = ANY(%s)",
            (workflows,),
        ).fetchall()
        effects = db.execute(f"SELECT job_id, attempt, at, seen FROM {s}.effects").fetchall()
        runs = db.execute(f"SELECT job_id, attempt, started, ended FROM {s}.runs").fetchall()
        moves = db.execute(f"SELECT job_id, old, new, waiting_on FROM {s}.moves ORDER BY n")
        record = Record(flows, jobs, defaultdict(list), defaultdict(list), defaultdict(list),
                        defaultdict(list), 0)  # fmt: skip
        for job_id, old, new, waiting in moves:
            record.moves[job_id].append((old, new, waiting))
    for up, dependent in edges:
        record.upstream[dependent].append(up)
    for job_id, attempt, at, seen in effects:
        if job_id in jobs:
            record.effects[job_id].append((attempt, at, seen))
        else:
            record.stray_effects += 1
    for job_id, attempt, started, ended in runs:
        record.runs[job_id].append((attempt, started, ended))
    return record


def unfinished(rec: Record) -> list[str]:
    """Workflows not succeeded, or whose total is not their jobs; jobs left open."""
    found = [
        f"workflow {w}: {outcome}" for w, outcome, _ in rec.workflows if outcome != "succeeded"
    ]
    counted = Counter(j.workflow_id for j in rec.jobs.values())
    found += [f"workflow {w}: total {t}, {counted[w]} jobs" for w, _, t in rec.workflows
              if t != counted[w]]  # fmt: skip
    found += [
        f"job {j.id} ({j.step}): {j.state}, waiting on {j.waiting_on}"
        for j in rec.jobs.values()
        if j.state != "succeeded" or j.waiting_on != 0
    ]
    return found


def effects_once(rec: Record) -> list[str]:
    """One effect per job, of its last attempt, having seen every upstream step's result."""
    found = []
    if rec.stray_effects:
        found.append(f"{rec.stray_effects} effects of no job of these workflows")
    for job in rec.jobs.values():
        effects = rec.effects.get(job.id, [])
        if len(effects) != 1:
            found.append(f"job {job.id} ({job.step}): {len(effects)} effects")
            continue
        attempt, _, seen = effects[0]
        if attempt != job.attempts:
            found.append(f"job {job.id} ({job.step}): effect of attempt {attempt}/{job.attempts}")
        expected = {rec.jobs[u].step: rec.jobs[u].key for u in rec.upstream.get(job.id, [])}
        if seen != expected:
            found.append(f"job {job.id} ({job.step}) saw {seen}, not {expected}")
    return found


def started_after_upstream(rec: Record) -> list[str]:
    """Every run of every step began after each of its upstream steps' effects."""
    found = []
    for job_id, ups in rec.upstream.items():
        ends = [(rec.effects[u][0][1], u) for u in ups if rec.effects.get(u)]
        if not ends or not rec.runs.get(job_id):
            continue  # reported by effects_once
        last, up = max(ends)
        early = [(a, t) for a, t, _ in rec.runs[job_id] if t <= last]
        if early:
            found.append(
                f"job {job_id} ({rec.jobs[job_id].step}) attempt {early[0][0]} began at"
                f" {early[0][1].time()}, before job {up}'s effect at {last.time()}"
            )
    return found


def released_once(rec: Record) -> list[str]:
    """A job with upstream jobs left `blocked` once, for `ready`, waiting on none, before
    its first claim; a job without never was blocked."""
    found = []
    for job in rec.jobs.values():
        moves = rec.moves.get(job.id, [])
        releases = [i for i, m in enumerate(moves) if m[0] == "blocked"]
        if job.id not in rec.upstream:
            if releases:
                found.append(f"job {job.id} ({job.step}), of no upstream job: {moves}")
            continue
        claims = [i for i, m in enumerate(moves) if m[1] == "running"]
        if len(releases) != 1 or moves[releases[0]] != ("blocked", "ready", 0):
            found.append(f"job {job.id} ({job.step}) not released once, on none: {moves}")
        elif not claims or claims[0] < releases[0]:
            found.append(f"job {job.id} ({job.step}) claimed before its release: {moves}")
    return found


def aims_landed(rec: Record, aims: list[Aim]) -> list[str]:
    """Each kill landed mid-run: the attempt it hit has no end and did not commit."""
    found = []
    for aim in aims:
        if aim.fault == RESTART:
            continue  # a step may live through a restart
        runs = [r for r in rec.runs.get(aim.job_id, []) if r[0] == aim.attempt]
        committed = [e[0] for e in rec.effects.get(aim.job_id, [])]
        if any(end is not None for _, _, end in runs) or aim.attempt in committed:
            found.append(f"{aim} did not stop its run: {runs}, effects of {committed}")
    return found


def as_built(rec: Record, graphs: dict[int, Graph]) -> list[str]:
    """Each workflow's steps and edges are the graph built (and grown) for it."""
    found = []
    for workflow_id, graph in graphs.items():
        steps = {j.id: j.step for j in rec.jobs.values() if j.workflow_id == workflow_id}
        stored = {name: {steps[u] for u in rec.upstream.get(i, [])} for i, name in steps.items()}
        if stored != graph.after:
            names = sorted(stored.keys() | graph.after.keys())
            wrong = [(n, stored.get(n), graph.after.get(n)) for n in names
                     if stored.get(n) != graph.after.get(n)]  # fmt: skip
            found.append(f"workflow {workflow_id} ({graph.wf.name}) is not as built: {wrong[:6]}")
    return found


# -- a run ---------------------------------------------------------------------------------


def run_under_faults(
    workload: Workload, fleet: Fleet, injector: Injector, graphs: list[Graph]
) -> tuple[Record, list[Aim]]:
    """Two supervisors run `graphs` through PLAN; what the run left, checked, and the
    faults."""
    fleet.start(2)
    fleet.wait_ready()
    started = time.monotonic()
    with psycopg.connect(workload.dsn) as conn:
        ids = [g.wf.enqueue(conn=conn) for g in graphs]  # in one transaction
    aims = Faults(workload, fleet, injector, ids).run(PLAN)
    for g in graphs:
        assert finished(g.wf) == "succeeded", g.wf.status()
    took = time.monotonic() - started
    fleet.check_alive()
    rec = read(workload, ids)
    print(f"{len(rec.jobs)} steps in {took:.1f} s; faults: {aims}")
    for problems in (
        unfinished(rec), effects_once(rec), started_after_upstream(rec), released_once(rec),
        as_built(rec, dict(zip(ids, graphs, strict=True))), aims_landed(rec, aims),
    ):  # fmt: skip
        assert problems == [], f"{problems[:10]}\n{fleet.output()[-3000:]}"
    supervisors = {liveness_holder(j.ran_by) for j in rec.jobs.values() if j.ran_by}
    assert len(supervisors) >= 2, supervisors  # two claimed at once
    assert workload.verdict().problems == []
    return rec, aims


@pytest.mark.timeout(120)
def test_diamonds_release_their_last_step_once_under_faults(
    workload: Workload, wf_fleet: Fleet, injector: Injector
) -> None:
    graphs = diamonds(workload.app, 60, holds=range(0, 60, 4))
    rec, _ = run_under_faults(workload, wf_fleet, injector, graphs)
    assert len(rec.jobs) == 240


@pytest.mark.timeout(120)
def test_a_fan_in_of_a_thousand_steps_runs_its_join_once_after_all_under_faults(
    workload: Workload, wf_fleet: Fleet, injector: Injector
) -> None:
    graph = fan_in(workload.app, 1000, holds=range(20, 1000, 40))
    rec, _ = run_under_faults(workload, wf_fleet, injector, [graph])
    assert len(rec.jobs) == 1001


@pytest.mark.timeout(180)
def test_a_chain_of_a_thousand_steps_runs_in_order_under_faults(
    workload: Workload, wf_fleet: Fleet, injector: Injector
) -> None:
    graph = chain(workload.app, CHAIN, holds=range(CHAIN // 20, CHAIN, CHAIN // 10))
    rec, _ = run_under_faults(workload, wf_fleet, injector, [graph])
    assert len(rec.jobs) == CHAIN


@pytest.mark.timeout(120)
def test_a_graph_grown_at_run_time_runs_its_downstream_step_last_under_faults(
    workload: Workload, wf_fleet: Fleet, injector: Injector
) -> None:
    graph = growing(workload.app, 40, holds=list(range(1, 40, 4)))
    rec, aims = run_under_faults(workload, wf_fleet, injector, [graph])
    # The first kill found the scan growing (nothing else runs yet), some parts added:
    # its next attempt found those, added each of the others once (as_built: 43 steps,
    # each once) and grafted all of them in before summary.
    (scan,) = [j for j in rec.jobs.values() if j.step == "scan"]
    assert (aims[0].fault, aims[0].job_id) == (KILL, scan.id)
    assert scan.attempts >= 2


# -- limits --------------------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_concurrency_limit_holds_for_steps_released_together(
    workload: Workload, wf_fleet: Fleet, injector: Injector
) -> None:
    # Twenty steps of a task with Limit(concurrency=1), released by one completion on
    # four workers, two of them killed mid-step (runs_of ends a killed run at its
    # charge: test_limits.py's docstring says why an overlap it finds is real).
    graph = Graph(workload.app.workflow(name="limited"))
    root = graph.add("root", "root")
    for i in range(20):
        graph.add(f"solo-{i}", f"solo-{i}", [root], HOLD if i % 5 == 2 else 0.1, task="solo")
    wf_fleet.start(2)
    wf_fleet.wait_ready()
    workflow_id = graph.wf.enqueue()
    aims = Faults(workload, wf_fleet, injector, [workflow_id]).run((KILL, KILL))
    assert finished(graph.wf) == "succeeded"
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        runs = [
            dataclasses.replace(r, key="") for r in runs_of(db, workload.schema) if r.task == "solo"
        ]
    peak = peaks(runs)[("solo", "")]
    assert peak.n == 1, "\n".join(str(r) for r in peak.runs)
    assert len({r.job_id for r in runs}) == 20
    rec = read(workload, [workflow_id])
    for problems in (
        unfinished(rec), effects_once(rec), started_after_upstream(rec), released_once(rec),
        as_built(rec, {workflow_id: graph}), aims_landed(rec, aims),
    ):  # fmt: skip
        assert problems == [], problems[:10]
