"""Workflows: what a graph costs to insert, to run, to keep blocked and to release.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.workflows            # ~5 minutes
    .venv/bin/python -m bench.workflows --quick    # ~3 minutes: fewer rounds, 200,000 blocked

Everything runs in a fresh schema `bench_<random>` (phase 3 adds a second one), dropped
at the end. The graphs' steps are no-ops (bench/workflows_app.py), each named (`s17`).

1. insert: `wf.enqueue()` of 1,000-step graphs (10 layers of 100, each step after 2 or 3
   random steps of the layer above; a chain) and of 10,000-step ones (10 layers of
   1,000; a chain; 1 -> 9,998 -> 1), the tables emptied before each run, the graph built
   with `wf.add` before the clock starts: median and p95 of --inserts runs (a third as
   many for 10,000 steps) after a warm-up one. Target: p95 <= 50 ms for 1,000 steps,
   and the same per step, 500 ms, for 10,000. Beside each, what building it with
   `wf.add` took; and once, 10,000 steps of one task with their default names (`step`,
   `step#2`, ...).
2. drain: the 1 -> 9,998 -> 1 graph against the same 10,000 no-ops enqueued with
   `enqueue_many` and no edges, and those again with migration 0020's triggers disabled
   (what workflows cost jobs of none: target >= 0.97x), alternately (A B C A B C ...),
   --rounds times each, then 10
   layers of 1,000 (each after 2-3 of the layer above) once, under one `forklift run
   bench.workflows_app:app --workers 2` at its defaults: jobs/s from the first start to
   the last completion (database clock). Target: the graph >= 0.8x the plain jobs.
3. blocked: --other (20,000) no-ops of queue "other" drained by a `forklift run --queues
   other --workers 2` started for each drain, in a schema that also holds one workflow
   whose root waits in a queue no one serves and --blocked (1,000,000) dependents of it,
   blocked, in queue "other" itself (the drained queue: the harder case for a claim),
   against the same drain in a schema without them, alternately, --rounds times each.
   The blocked rows go in by `INSERT ... SELECT generate_series` straight into jobs and
   workflow_edges: wf.enqueue would take about 100 times phase 1's 10,000-step fan-out,
   after a minute of wf.add. Target: >= 0.95x. Also the rows that sequential scans of
   jobs read while each supervisor ran (pg_stat_user_tables; the bench's own polls read
   indexes only): none may read the blocked rows; and EXPLAIN ANALYZE of the plain
   claim (job_claim_one) among them.
4. release: the roots of fan-outs 1 -> n (n = 0, 100, 1,000, 10,000; --release-rounds of
   each, all inserted first) claimed with forklift's own claim, then each completed with
   its own group completion (job_complete_many), timed in a transaction: the
   statement's wall time, the rows it updated (pg_stat_xact_user_tables: 1 + n, so this
   one statement released them all) and the dependents ready before the commit; then
   the commit. Medians. Target: 10,000 dependents cost at most 15x what 1,000 do
   (linear: 10x), each less what 1 -> 0 costs. Beside it, what a job's completion
   costs when the job is a workflow's step: forklift's group completion of 64 claimed
   steps of one workflow (released, with no dependents) against 64 plain jobs.
5. deadlocks: the 1 -> 9,998 -> 1 graph --rounds times and 10 layers of 1,000 once at
   `--concurrency 4` (group completions carry several steps), and phase 2's drains at
   the default concurrency: per graph, "deadlock detected" in the server's log naming
   this run's schema (--server-log; all of them, and pg_stat_database.deadlocks, which
   counts anyone's, beside it); the lines of forklift's logs that mention a deadlock;
   and the jobs that did not succeed at their first attempt, or whose count of upstream
   jobs to wait for did not end at 0 (a release twice, or early, would take it below).

Before each phase the bench waits up to --quiet seconds for the rest of the machine to
go quiet. Every number is printed with its target, in one table at the end.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/workflows.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from psycopg.rows import dict_row

import forklift
from bench._harness import (
    Bench,
    ForkliftProcess,
    Row,
    load_average,
    non_negative_float,
    parser,
    percentile,
    positive,
    print_table,
    say,
    wait_quiet,
)
from bench.workflows_app import register
from forklift import _sql
from forklift.testing import wait_for

APP = "bench.workflows_app:app"
TASK = "step"
SEED = 7  # the layered graphs' edges: the same graph in every run
FAN = 9_998  # 1 -> FAN -> 1: 10,000 steps
INSERT_MS = 50.0  # target for a 1,000-step graph's insert; the same per step for 10,000
DRAIN_RATIO = 0.8
BLOCKED_RATIO = 0.95
LINEAR_MAX = 15.0  # 10,000 dependents' release over 1,000's (linear: 10)
OTHER = "other"  # phase 3's drained queue, which the blocked jobs are in too
HELD = "held"  # the blocked jobs' root waits here: no supervisor serves it
RELEASE = "release"  # phase 4's queue: no supervisor runs then
OWNER = "bench:release"  # phase 4's lease owner
WAIT = 300.0  # seconds any drain may take before the bench gives up
QUIET_CORES = 0.5  # what the rest of the machine may use when a phase starts

Build = Callable[[forklift.App], forklift.Workflow]


def ms(seconds: float, digits: int = 0) -> str:
    """`seconds` in milliseconds, as "12 ms" (`digits` after the point)."""
    return f"{seconds * 1000:,.{digits}f} ms"


# -- graphs ------------------------------------------------------------------------------


def layered(app: forklift.App, layers: int, width: int) -> forklift.Workflow:
    """`layers` layers of `width` steps, each after 2 or 3 random steps of the one above."""
    rng = random.Random(SEED)
    wf = app.workflow(name=f"{layers} layers of {width}")
    above: list[forklift.Step] = []
    for layer in range(layers):
        row = []
        for i in range(width):
            n = layer * width + i
            after = rng.sample(above, rng.choice((2, 3))) if above else []
            row.append(wf.add(TASK, {"n": n}, after=after, name=f"s{n}"))
        above = row
    return wf


def chain(app: forklift.App, steps: int, *, named: bool = True) -> forklift.Workflow:
    """`steps` steps one after another; `named`: s0, s1, ..., else the default names."""
    wf = app.workflow(name=f"chain of {steps}")
    last: list[forklift.Step] = []
    for n in range(steps):
        last = [wf.add(TASK, {"n": n}, after=last, name=f"s{n}" if named else None)]
    return wf


def fan(app: forklift.App, middle: int) -> forklift.Workflow:
    """1 -> `middle` -> 1: a root, `middle` steps after it, and one after them all."""
    wf = app.workflow(name=f"1 -> {middle} -> 1")
    root = wf.add(TASK, {}, name="root")
    steps = [wf.add(TASK, {"n": n}, after=[root], name=f"s{n}") for n in range(middle)]
    wf.add(TASK, {}, after=steps, name="last")
    return wf


def fan_out(app: forklift.App, n: int) -> forklift.Workflow:
    """A root and `n` steps after it, in queue RELEASE."""
    wf = app.workflow(name=f"1 -> {n}")
    root = wf.add(TASK, {}, name="root", queue=RELEASE)
    for i in range(n):
        wf.add(TASK, {"n": i}, after=[root], name=f"s{i}", queue=RELEASE)
    return wf


# -- the server's log --------------------------------------------------------------------


@dataclass(frozen=True)
class Deadlocks:
    """What one watch saw: "deadlock detected" in the server's log (None: not readable),
    those naming the bench's schema among them, and pg_stat_database's count."""

    logged: int | None
    ours: int | None
    counted: int


class DeadlockWatch:
    """The deadlocks between start() and stop(): the server log's new lines, and the
    database's deadlock count (anyone's)."""

    def __init__(self, bench: Bench, log: Path | None) -> None:
        self.bench = bench
        self.log = log
        self.offset = 0
        self.counted = 0

    def start(self) -> None:
        self.offset = self.log.stat().st_size if self.log else 0
        self.counted = self._count()

    def _count(self) -> int:
        query = "SELECT deadlocks FROM pg_stat_database WHERE datname = current_database()"
        self.bench.db.execute("SELECT pg_stat_clear_snapshot()")
        return int(self.bench.scalar(query))

    def stop(self) -> Deadlocks:
        counted = self._count() - self.counted
        if self.log is None:
            return Deadlocks(None, None, counted)
        with self.log.open("rb") as f:
            f.seek(self.offset)
            lines = f.read().decode(errors="replace").splitlines()
        logged = ours = 0
        for i, line in enumerate(lines):
            if "deadlock detected" not in line:
                continue
            logged += 1
            pid = re.search(r"\[(\d+)\]", line)
            tag = f"[{pid.group(1)}]" if pid else line
            # Its DETAIL, CONTEXT and STATEMENT lines: the same backend's, and the
            # continuation lines of a statement (indented).
            entry = [x for x in lines[i : i + 80] if tag in x or x[:1].isspace()]
            ours += any(self.bench.schema in x for x in entry)
        return Deadlocks(logged, ours, counted)


def server_log(bench: Bench, given: str | None) -> Path | None:
    """The server's log file: `given`, else Debian's for this cluster
    (/var/log/postgresql/postgresql-<cluster_name>.log); None if it cannot be read."""
    if given is None:
        cluster = str(bench.scalar("SELECT current_setting('cluster_name')") or "")
        if not cluster:
            return None
        given = f"/var/log/postgresql/postgresql-{cluster.replace('/', '-')}.log"
    path = Path(given)
    try:
        with path.open("rb"):
            return path
    except OSError:
        return None


# -- the bench ---------------------------------------------------------------------------


class WorkflowBench(Bench):
    """The bench's schema, the producer App, and the supervisor running (one at a time)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "workflows")
        self.supervisor: ForkliftProcess | None = None
        self.logged: list[str] = []  # what the stopped supervisors printed

    @property
    def queries(self) -> dict[str, str]:
        """forklift's job queries (claim, completion) for this schema."""
        return _sql.load("forklift.store", "queries.sql", self.schema)

    def reset(self) -> None:
        """Empty the jobs and the workflows."""
        self.db.execute(
            f"TRUNCATE {self.schema}.jobs, {self.schema}.workflows, {self.schema}.workflow_edges"
        )

    # -- supervisors ---------------------------------------------------------------------

    def supervise(self, *flags: str) -> None:
        """Start `forklift run APP --workers 2 FLAGS` (stopping the one running)."""
        self.stop_supervisor()
        self.supervisor = self.start("run", APP, "--workers", "2", "--log-level", "WARNING", *flags)

    def stop_supervisor(self) -> None:
        """SIGTERM the supervisor and wait for it; keep what it printed."""
        if self.supervisor is None:
            return
        code = self.supervisor.stop()
        self.logged += self.supervisor.output().splitlines()
        if code != 0:
            self.logged.append(f"supervisor {self.supervisor.pid} exited with {code}")
        self.supervisor = None

    def wait_sessions_gone(self, since: Any) -> None:
        """Wait until no session of this schema begun after `since` (the database's clock)
        is left but this process's: the stopped supervisor's backends have exited, and so
        have written their statistics."""
        wait_for(
            lambda: (
                not self.scalar(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_start >= %s"
                    " AND query LIKE %s AND pid <> pg_backend_pid()",
                    (since, f"%{self.schema}%"),
                )
            ),
            timeout=30,
            interval=0.05,
            what="the supervisor's sessions gone",
        )

    # -- progress and results ------------------------------------------------------------

    def wait_succeeded(self, n: int) -> None:
        """Wait until `n` jobs succeeded (the table holds only the round's)."""
        if self.supervisor is not None:
            self.supervisor.check_alive()
        wait_for(
            lambda: self.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'") >= n,
            timeout=WAIT,
            interval=0.05,
            what=f"{n:,} jobs succeeded",
        )

    def wait_emptied(self, queue: str) -> None:
        """Wait until no job of `queue` is ready or running, counted on their partial
        indexes (its jobs have no limit key)."""
        ready = "SELECT count(*) FROM {s}.jobs WHERE state = 'ready' AND limit_key IS NULL"
        running = "SELECT count(*) FROM {s}.jobs WHERE state = 'running'"
        left = f"SELECT ({ready} AND queue = %s) + ({running} AND queue = %s)"
        wait_for(
            lambda: not self.scalar(left, (queue, queue)),
            timeout=WAIT,
            interval=0.05,
            what=f"queue {queue} drained",
        )

    def rate(self, queue: str | None = None) -> float:
        """Jobs/s of the succeeded jobs (of `queue`) from the first start to the last end."""
        row = self.db.execute(
            f"SELECT count(*), extract(epoch FROM max(completed_at) - min(started_at))"
            f" FROM {self.schema}.jobs WHERE state = 'succeeded'"
            f" AND (%(q)s::text IS NULL OR queue = %(q)s::text)",
            {"q": queue},
        ).fetchone()
        assert row is not None
        return int(row[0]) / float(row[1])

    def anomalies(self, queue: str | None = None) -> int:
        """Jobs (of `queue`; blocked ones left out) that did not succeed at their first
        attempt."""
        row = self.db.execute(
            f"SELECT count(*) FROM {self.schema}.jobs WHERE state <> 'blocked'"
            " AND (%(q)s::text IS NULL OR queue = %(q)s::text)"
            " AND (state <> 'succeeded' OR attempts <> 1 OR last_error IS NOT NULL)",
            {"q": queue},
        ).fetchone()
        assert row is not None
        return int(row[0])

    def miscounted(self) -> int:
        """Workflow jobs whose count of edges to wait for did not end at 0: each edge into
        a job is resolved once, so a job released twice, or early, would end below 0 (and
        one never released would not have succeeded)."""
        return int(
            self.scalar(
                "SELECT count(*) FROM {s}.jobs WHERE workflow_id IS NOT NULL AND waiting_on <> 0"
            )
        )

    # -- phase 4 -------------------------------------------------------------------------

    def claim(self, limit: int) -> dict[int, int]:
        """Claim up to `limit` jobs of queue RELEASE for OWNER with forklift's own claim:
        their attempts by id."""
        params = {
            "queue": RELEASE, "owner": OWNER, "limit": limit, "lease": 600.0,
            "alone": False, "floor": None,
        }  # fmt: skip
        found = self.db.cursor(row_factory=dict_row).execute(self.queries["job_claim_one"], params)
        return {int(j["id"]): int(j["attempt"]) for j in found.fetchall() if j["id"] is not None}

    def complete(self, jobs: dict[int, int]) -> float:
        """Complete `jobs` (attempts by id, OWNER's) with forklift's group completion, in
        one statement and its commit: the seconds it took."""
        ids = sorted(jobs)
        params = {"ids": ids, "attempts": [jobs[i] for i in ids], "owner": OWNER}
        started = time.perf_counter()
        done = self.db.execute(self.queries["job_complete_many"], params).fetchall()
        seconds = time.perf_counter() - started
        if len(done) != len(jobs):
            raise RuntimeError(f"{len(done)} of {len(jobs)} jobs completed")
        return seconds

    # -- phase 3 -------------------------------------------------------------------------

    def fill_blocked(self, n: int) -> float:
        """One workflow: a root in queue HELD and `n` blocked dependents of it in queue
        OTHER, by SQL, then VACUUM ANALYZE; the seconds taken."""
        s = self.schema
        started = time.perf_counter()
        with self.db.transaction():
            self.db.execute("SET LOCAL forklift.quiet = 'on'")  # no NOTIFY per row
            wid = self.scalar(
                "INSERT INTO {s}.workflows (name, total) VALUES ('blocked', %s) RETURNING id",
                (n + 1,),
            )
            root = self.scalar(
                "INSERT INTO {s}.jobs (queue, task, workflow_id, step)"
                " VALUES (%s, %s, %s, 'root') RETURNING id",
                (HELD, TASK, wid),
            )
            self.db.execute(
                f"INSERT INTO {s}.jobs (queue, task, args, state, workflow_id, step, waiting_on)"
                " SELECT %s, %s, jsonb_build_object('n', g), 'blocked', %s, 's' || g, 1"
                " FROM generate_series(1, %s) AS g",
                (OTHER, TASK, wid, n),
            )
            self.db.execute(
                f"INSERT INTO {s}.workflow_edges (upstream, dependent, workflow_id)"
                f" SELECT %s, j.id, %s FROM {s}.jobs AS j WHERE j.workflow_id = %s AND j.id <> %s",
                (root, wid, wid, root),
            )
        self.db.execute(f"VACUUM ANALYZE {s}.jobs, {s}.workflow_edges")
        return time.perf_counter() - started

    def purge(self, queue: str) -> None:
        """Delete the succeeded jobs of `queue` and VACUUM: the next drain finds the table
        as the last one did."""
        self.db.execute(
            f"DELETE FROM {self.schema}.jobs WHERE state = 'succeeded' AND queue = %s", (queue,)
        )
        self.db.execute(f"VACUUM {self.schema}.jobs")

    def seq_read(self) -> int:
        """Rows sequential scans of jobs have read so far (pg_stat_user_tables)."""
        self.db.execute("SELECT pg_stat_force_next_flush()")  # this session's own, next
        self.db.execute("SELECT pg_stat_clear_snapshot()")
        return int(
            self.scalar(
                "SELECT seq_tup_read FROM pg_stat_user_tables WHERE relid = %s::regclass",
                (f"{self.schema}.jobs",),
            )
        )

    def explain_claim(self, queue: str, limit: int) -> list[str]:
        """EXPLAIN ANALYZE of forklift's plain claim of `limit` jobs of `queue` (rolled back)."""
        params = {
            "queue": queue, "owner": "bench:explain", "limit": limit, "lease": 30.0,
            "alone": False, "floor": None,
        }  # fmt: skip
        with self.db.transaction(force_rollback=True):
            plan = self.db.execute(
                "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + self.queries["job_claim_one"], params
            ).fetchall()
        return [str(r[0]) for r in plan]


# -- 1. insert ---------------------------------------------------------------------------


def time_insert(bench: WorkflowBench, build: Build, runs: int) -> tuple[list[float], list[float]]:
    """(seconds building the graph, seconds in wf.enqueue()) of `runs` runs, after one
    more not counted (the producer's pool opening, the statements' first planning)."""
    building: list[float] = []
    inserting: list[float] = []
    for i in range(runs + 1):
        bench.reset()
        started = time.perf_counter()
        wf = build(bench.app)
        built = time.perf_counter()
        wf.enqueue()
        ended = time.perf_counter()
        if i:
            building.append(built - started)
            inserting.append(ended - built)
    return building, inserting


def phase_insert(bench: WorkflowBench, args: argparse.Namespace, rows: list[Row]) -> float:
    """Phase 1's rows; returns the median seconds of the 10,000-step fan-out's insert."""
    shapes: list[tuple[int, str, Build, int]] = [
        (1_000, "10 layers of 100, each after 2-3", lambda a: layered(a, 10, 100), args.inserts),
        (1_000, "a chain", lambda a: chain(a, 1_000), args.inserts),
        (10_000, "10 layers of 1,000", lambda a: layered(a, 10, 1_000), args.inserts // 3),
        (10_000, "a chain", lambda a: chain(a, 10_000), args.inserts // 3),
        (10_000, f"1 -> {FAN:,} -> 1", lambda a: fan(a, FAN), args.inserts // 3),
    ]
    fan_insert = 0.0
    for steps, label, build, runs in shapes:
        runs = max(runs, 2)
        say(f"insert: {steps:,} steps, {label}, {runs} runs ...")
        building, inserting = time_insert(bench, build, runs)
        med, p95 = statistics.median(inserting) * 1000, percentile(inserting, 95) * 1000
        target = INSERT_MS * steps / 1_000
        rows.append(
            Row(
                f"wf.enqueue(), {steps:,} steps: {label} (median / p95 of {runs})",
                f"{med:.1f} / {p95:.1f} ms (wf.add before: {ms(statistics.median(building))})",
                f"p95 <= {target:.0f} ms",
                p95 <= target,
            )
        )
        fan_insert = statistics.median(inserting) if label.startswith("1 ->") else fan_insert
    say("insert: building 10,000 steps of one task with default names, once ...")
    started = time.perf_counter()
    chain(bench.app, 10_000, named=False)
    rows.append(
        Row(
            "wf.add x 10,000, one task, default step names (step, step#2, ...), a chain",
            f"{(time.perf_counter() - started) * 1000:,.0f} ms",
        )
    )
    bench.reset()
    return fan_insert


# -- 2. drain, and 5. deadlocks ----------------------------------------------------------


def drain_graph(bench: WorkflowBench, build: Build, steps: int) -> float:
    """Enqueue the graph `build` makes (`steps` steps) to the running supervisor; jobs/s."""
    bench.reset()
    wf = build(bench.app)
    wf.enqueue()
    bench.wait_succeeded(steps)
    rate = bench.rate()
    outcome = wf.wait(timeout=60).state
    if outcome != "succeeded":
        raise RuntimeError(f"workflow {wf.id} ended {outcome}")
    return rate


def drain_plain(bench: WorkflowBench, n: int) -> float:
    """Enqueue `n` no-ops with enqueue_many to the running supervisor; jobs/s."""
    bench.reset()
    bench.app.enqueue_many([(TASK, {"n": i}) for i in range(n)])
    bench.wait_succeeded(n)
    return bench.rate()


# Migration 0020's triggers: what every job's state change passes, workflow or not.
TRIGGERS = ("jobs_workflow_hold", "jobs_workflow_moved", "jobs_workflow_settle")


def drain_untriggered(bench: WorkflowBench, n: int) -> float:
    """drain_plain with the workflow triggers disabled: what they cost jobs of no
    workflow (the claims and completions of the same drain pass them)."""
    for name in TRIGGERS:
        bench.db.execute(f"ALTER TABLE {bench.schema}.jobs DISABLE TRIGGER {name}")
    try:
        return drain_plain(bench, n)
    finally:
        for name in TRIGGERS:
            bench.db.execute(f"ALTER TABLE {bench.schema}.jobs ENABLE TRIGGER {name}")


def fan_drain(bench: WorkflowBench) -> float:
    return drain_graph(bench, lambda a: fan(a, FAN), FAN + 2)


def layered_drain(bench: WorkflowBench) -> float:
    return drain_graph(bench, lambda a: layered(a, 10, 1_000), 10_000)


@dataclass
class Drained:
    """Drains under one supervisor, by kind: their rates, the deadlocks while they ran,
    the jobs amiss after them, and the lines of its log that mention a deadlock."""

    rates: dict[str, list[float]] = field(default_factory=dict)
    deadlocks: dict[str, list[Deadlocks]] = field(default_factory=dict)
    amiss: int = 0
    mentions: int = 0


def drains(
    bench: WorkflowBench, watch: DeadlockWatch, flags: Sequence[str],
    plan: Sequence[tuple[str, Callable[[WorkflowBench], float]]],
) -> Drained:  # fmt: skip
    """Run the drains of `plan` in order under one `forklift run ... FLAGS`."""
    bench.supervise(*flags)
    found = Drained()
    for kind, drain in plan:
        say(f"  {kind} ...")
        watch.start()
        rate = drain(bench)
        found.deadlocks.setdefault(kind, []).append(watch.stop())
        found.rates.setdefault(kind, []).append(rate)
        found.amiss += bench.anomalies() + bench.miscounted()
        say(f"    {rate:,.0f} jobs/s")
    logged = len(bench.logged)
    bench.stop_supervisor()
    found.mentions = sum("deadlock" in line.lower() for line in bench.logged[logged:])
    return found


FAN_KIND = f"1 -> {FAN:,} -> 1"
PLAIN_KIND = f"{FAN + 2:,} no-ops, enqueue_many, no edges"
UNTRIGGERED_KIND = f"{FAN + 2:,} no-ops, the workflow triggers disabled"
LAYERED_KIND = "10 layers of 1,000, each after 2-3"


def rate_rows(rows: list[Row], found: Drained, label: str) -> None:
    """Per kind of drain, its median rate."""
    for kind, rates in found.rates.items():
        each = f"median of {len(rates)}" if len(rates) > 1 else "once"
        rate = statistics.median(rates)
        rows.append(Row(f"drain {kind} ({label}, {each})", f"{rate:,.0f} jobs/s"))


def trouble_rows(rows: list[Row], found: Drained, label: str) -> None:
    """Per graph, the deadlocks its drains met; the jobs amiss; the log's mentions."""
    for kind, seen in found.deadlocks.items():
        if kind in (PLAIN_KIND, UNTRIGGERED_KIND):
            continue  # no workflow's trigger runs for them
        counted = sum(d.counted for d in seen)
        if any(d.logged is None for d in seen):
            value, met = f"log not readable; pg_stat_database: {counted}", counted == 0
        else:
            ours, logged = sum(d.ours or 0 for d in seen), sum(d.logged or 0 for d in seen)
            value, met = f"{ours} ({logged} in the log, {counted} in pg_stat_database)", ours == 0
        rows.append(Row(f"  deadlocks draining {kind} ({label})", value, "0", met))
    rows.append(
        Row(
            f"  jobs not succeeded at their first attempt, or a wait count not 0 ({label})",
            f"{found.amiss}",
            "0",
            found.amiss == 0,
        )
    )
    rows.append(
        Row(f"  lines of forklift's log that mention a deadlock ({label})", f"{found.mentions}")
    )


def phase_drain(
    bench: WorkflowBench, args: argparse.Namespace, rows: list[Row], watch: DeadlockWatch
) -> None:
    """Phase 2's rows, and phase 5's at the default concurrency."""
    say(f"drain: {args.rounds} rounds of {FAN_KIND}, then plain; {LAYERED_KIND} once ...")
    plan = [
        (FAN_KIND, fan_drain),
        (PLAIN_KIND, lambda b: drain_plain(b, FAN + 2)),
        (UNTRIGGERED_KIND, lambda b: drain_untriggered(b, FAN + 2)),
    ] * args.rounds
    found = drains(bench, watch, (), [*plan, (LAYERED_KIND, layered_drain)])
    label = "--workers 2, defaults"
    rate_rows(rows, found, label)
    plain = statistics.median(found.rates[PLAIN_KIND])
    ratio = statistics.median(found.rates[FAN_KIND]) / plain
    rows.append(
        Row(
            f"  {FAN_KIND} / plain", f"{ratio:.2f}x", f">= {DRAIN_RATIO:.2f}x", ratio >= DRAIN_RATIO
        )
    )
    tax = plain / statistics.median(found.rates[UNTRIGGERED_KIND])
    rows.append(
        Row("  plain with the workflow triggers / without", f"{tax:.2f}x", ">= 0.97x", tax >= 0.97)
    )
    trouble_rows(rows, found, label)


def phase_deadlocks(
    bench: WorkflowBench, args: argparse.Namespace, rows: list[Row], watch: DeadlockWatch
) -> None:
    """Phase 5's rows at --concurrency 4."""
    say(f"deadlocks: {args.rounds} rounds of {FAN_KIND}, {LAYERED_KIND} once, --concurrency 4 ...")
    plan = [(FAN_KIND, fan_drain)] * args.rounds + [(LAYERED_KIND, layered_drain)]
    found = drains(bench, watch, ("--concurrency", "4"), plan)
    rate_rows(rows, found, "--concurrency 4")
    trouble_rows(rows, found, "--concurrency 4")


# -- 3. blocked --------------------------------------------------------------------------


def drain_other(bench: WorkflowBench, n: int) -> tuple[float, int]:
    """Drain `n` no-ops of queue OTHER with a supervisor started for it: (jobs/s, rows
    sequential scans of jobs read while it ran)."""
    bench.purge(OTHER)
    bench.app.enqueue_many([forklift.JobSpec(TASK, {"n": i}, queue=OTHER) for i in range(n)])
    bench.db.execute(f"ANALYZE {bench.schema}.jobs")
    # The bench's own polls read indexes only, so that what the table scans read is
    # forklift's: a count of the ready jobs of a queue, most of the table, would be
    # planned as a table scan (and it would read the blocked rows too).
    bench.db.execute("SET enable_seqscan = off")
    read = bench.seq_read()
    since = bench.scalar("SELECT now()")
    bench.supervise("--queues", OTHER)
    bench.wait_emptied(OTHER)
    bench.stop_supervisor()
    bench.wait_sessions_gone(since)
    read = bench.seq_read() - read
    bench.db.execute("RESET enable_seqscan")
    rate = bench.rate(OTHER)
    amiss = bench.anomalies(OTHER)
    if amiss:
        raise RuntimeError(f"{amiss} jobs of queue {OTHER} did not succeed at their first attempt")
    return rate, read


def phase_blocked(
    bench: WorkflowBench, args: argparse.Namespace, rows: list[Row], fan_insert: float
) -> list[str]:
    """Phase 3's rows; returns the claim's plan among the blocked jobs."""
    blocked = args.blocked
    rates: dict[int, list[float]] = {0: [], blocked: []}
    reads: dict[int, list[int]] = {0: [], blocked: []}
    bench.reset()
    with WorkflowBench(bench.dsn).session() as heavy:
        say(f"blocked: inserting {blocked:,} blocked jobs and their edges into {heavy.schema} ...")
        seconds = heavy.fill_blocked(blocked)
        for r in range(args.rounds):
            for b, n in ((bench, 0), (heavy, blocked)):
                say(f"blocked: round {r + 1} of {args.rounds}, {n:,} blocked beside ...")
                rate, read = drain_other(b, args.other)
                rates[n].append(rate)
                reads[n].append(read)
                say(f"  {rate:,.0f} jobs/s; sequential scans read {read:,} rows")
        heavy.purge(OTHER)
        heavy.app.enqueue_many([forklift.JobSpec(TASK, {}, queue=OTHER)] * args.other)
        heavy.db.execute(f"ANALYZE {heavy.schema}.jobs")
        plan = heavy.explain_claim(OTHER, 16)
        bench.logged += heavy.logged
    without, beside = statistics.median(rates[0]), statistics.median(rates[blocked])
    each = f"median of {args.rounds}, a supervisor each"
    rows.append(
        Row(
            f"{blocked:,} blocked jobs and their edges inserted by SQL (not wf.enqueue)",
            f"{seconds:.1f} s (wf.enqueue: ~{fan_insert * blocked / 10_000:.0f} s by phase 1)",
        )
    )
    rows.append(
        Row(f"drain {args.other:,} no-ops of queue {OTHER} ({each})", f"{without:,.0f} jobs/s")
    )
    rows.append(Row(f"  the same, {blocked:,} blocked jobs in that queue", f"{beside:,.0f} jobs/s"))
    ratio = beside / without
    rows.append(
        Row("  with / without", f"{ratio:.2f}x", f">= {BLOCKED_RATIO:.2f}x", ratio >= BLOCKED_RATIO)
    )
    most = max(reads[blocked])
    rows.append(
        Row(
            "  rows read by sequential scans of jobs in a run, most (with / without)",
            f"{most:,} / {max(reads[0]):,}",
            f"< {blocked:,}",
            most < blocked,
        )
    )
    return plan


# -- 4. release --------------------------------------------------------------------------

SIZES = (0, 100, 1_000, 10_000)  # the fan-outs whose roots' completions are timed
GROUP = 64  # jobs a timed group completion completes


@dataclass(frozen=True)
class Release:
    """One root's completion: the statement's and the commit's seconds, the rows of jobs
    the statement updated, and the dependents ready before the commit."""

    statement: float
    commit: float
    updated: int
    ready: int


def release(bench: WorkflowBench, wf: forklift.Workflow, attempt: int) -> Release:
    """Complete the root of `wf` (claimed by OWNER at `attempt`) with forklift's group
    completion, in a transaction timed statement by statement."""
    root = wf.steps[0].id
    updated = "SELECT n_tup_upd FROM pg_stat_xact_user_tables WHERE relid = %s::regclass"
    table = (f"{bench.schema}.jobs",)
    complete = {"ids": [root], "attempts": [attempt], "owner": OWNER}
    with bench.db.transaction():
        before = int(bench.scalar(updated, table))
        started = time.perf_counter()
        done = bench.db.execute(bench.queries["job_complete_many"], complete).fetchall()
        statement = time.perf_counter() - started
        rows = int(bench.scalar(updated, table)) - before
        ready = "SELECT count(*) FROM {s}.jobs WHERE workflow_id = %s AND state = 'ready'"
        n = int(bench.scalar(ready, (wf.id,)))
        committing = time.perf_counter()
    commit = time.perf_counter() - committing
    if len(done) != 1:
        raise RuntimeError(f"the completion of root {root} completed {len(done)} jobs")
    return Release(statement, commit, rows, n)


def releases(bench: WorkflowBench, rounds: int) -> dict[int, list[Release]]:
    """Every round's fan-outs (SIZES, rotated each round) inserted first, their roots
    claimed at once, then each root completed: the completions by size. One more fan-out,
    first, warms the triggers' plans up and is not counted."""
    bench.reset()
    order = [SIZES[(r + i) % len(SIZES)] for r in range(rounds) for i in range(len(SIZES))]
    graphs = [fan_out(bench.app, n) for n in [10, *order]]
    for wf in graphs:
        wf.enqueue()
    bench.db.execute(f"VACUUM ANALYZE {bench.schema}.jobs, {bench.schema}.workflow_edges")
    attempts = bench.claim(len(graphs))
    found: dict[int, list[Release]] = {n: [] for n in SIZES}
    for n, wf in zip([-1, *order], graphs, strict=True):
        done = release(bench, wf, attempts[wf.steps[0].id or 0])
        if n >= 0:
            found[n].append(done)
    bench.reset()
    return found


def group_completions(bench: WorkflowBench, steps: bool, rounds: int) -> list[float]:
    """Seconds of `rounds` group completions of GROUP claimed jobs: released steps of one
    workflow with no dependents (`steps`), or plain jobs."""
    bench.reset()
    n = rounds * GROUP
    if steps:
        fan_out(bench.app, n).enqueue()
        bench.complete(bench.claim(1))  # the root: its steps are ready
    else:
        bench.app.enqueue_many([forklift.JobSpec(TASK, {"n": i}, queue=RELEASE) for i in range(n)])
    bench.db.execute(f"VACUUM ANALYZE {bench.schema}.jobs")
    return [bench.complete(bench.claim(GROUP)) for _ in range(rounds)]


def phase_release(bench: WorkflowBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 4's rows."""
    say(f"release: {args.release_rounds} rounds of 1 -> {', '.join(f'{n:,}' for n in SIZES)} ...")
    found = releases(bench, args.release_rounds)
    median: dict[int, float] = {}
    for n in SIZES:
        runs = found[n]
        median[n] = statistics.median(x.statement for x in runs)
        commit = statistics.median(x.commit for x in runs)
        one = all(x.updated == 1 + n and x.ready == n for x in runs)
        each = f" ({(median[n] - median[0]) / n * 1e6:.1f} us a dependent)" if n else ""
        rows.append(
            Row(
                f"completing the root of 1 -> {n:,} (median of {len(runs)}): one statement",
                f"{ms(median[n], 2)}{each}; commit {ms(commit, 2)}",
                f"updates {1 + n:,}, {n:,} ready",
                one,
            )
        )
    ratio = (median[10_000] - median[0]) / (median[1_000] - median[0])
    rows.append(
        Row(
            "  10,000 dependents' release / 1,000's (each less 1 -> 0's)",
            f"{ratio:.1f}x",
            f"<= {LINEAR_MAX:.0f}x (linear: 10x)",
            ratio <= LINEAR_MAX,
        )
    )
    rounds = args.release_rounds * 4
    say(f"release: {rounds} group completions of {GROUP} steps, then of {GROUP} plain jobs ...")
    steps = statistics.median(group_completions(bench, True, rounds))
    plain = statistics.median(group_completions(bench, False, rounds))
    bench.reset()
    rows.append(
        Row(
            f"a group completion of {GROUP} running steps of one workflow, no dependents"
            f" (median of {rounds})",
            f"{ms(steps, 2)} ({steps / GROUP * 1e6:.0f} us a job)",
        )
    )
    rows.append(
        Row(
            f"  the same of {GROUP} plain jobs",
            f"{ms(plain, 2)} ({plain / GROUP * 1e6:.0f} us a job): steps {steps / plain:.1f}x",
        )
    )


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = parser("bench.workflows", __doc__)
    p.add_argument("--quick", action="store_true", help="fewer rounds, 200,000 blocked jobs")
    p.add_argument("--inserts", type=positive, help="runs per 1,000-step insert (30; quick 9)")
    p.add_argument("--rounds", type=positive, help="drains of each kind (3; quick 2)")
    p.add_argument(
        "--blocked", type=positive, help="blocked jobs in phase 3 (1,000,000; quick 200,000)"
    )
    p.add_argument(
        "--other", type=positive, default=20_000, help="jobs a phase 3 drain (%(default)s)"
    )
    p.add_argument(
        "--release-rounds", type=positive, help="completions per fan-out size (5; quick 3)"
    )
    p.add_argument(
        "--quiet",
        type=non_negative_float,
        default=10.0,
        help="seconds to wait before each phase for the rest of the machine to use less than"
        f" {QUIET_CORES} of a core (%(default)s)",
    )
    p.add_argument("--server-log", help="the server's log file (default: Debian's for the cluster)")
    return p


def defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options not given: the full run's values, or --quick's."""
    full = {"inserts": 30, "rounds": 3, "blocked": 1_000_000, "release_rounds": 5}
    quick = {"inserts": 9, "rounds": 2, "blocked": 200_000, "release_rounds": 3}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def print_plan(plan: Sequence[str], blocked: int) -> None:
    """The claim's plan as PostgreSQL printed it: its scans, buffers and times."""
    print()
    print("EXPLAIN (ANALYZE, BUFFERS) of the plain claim (job_claim_one) of 16 jobs of queue")
    print(f"{OTHER} among {blocked:,} blocked jobs of that queue, rolled back; its scans:")
    for line in plan:
        if re.search(r"Scan (using|on)|Seq Scan|^\S|^  Buffers|Execution Time|Planning Time", line):
            print(f"  {line.strip()}")


def main(argv: Sequence[str] | None = None) -> int:
    args = defaults(build_parser().parse_args(argv))
    rows: list[Row] = []
    started = time.monotonic()
    with WorkflowBench(args.dsn).session() as bench:
        watch = DeadlockWatch(bench, server_log(bench, args.server_log))
        say(f"server log: {watch.log or 'not readable: deadlocks from pg_stat_database only'}")
        wait_quiet(QUIET_CORES, args.quiet)
        fan_insert = phase_insert(bench, args, rows)
        wait_quiet(QUIET_CORES, args.quiet)
        phase_drain(bench, args, rows, watch)
        wait_quiet(QUIET_CORES, args.quiet)
        phase_deadlocks(bench, args, rows, watch)
        wait_quiet(QUIET_CORES, args.quiet)
        plan = phase_blocked(bench, args, rows, fan_insert)
        wait_quiet(QUIET_CORES, args.quiet)
        phase_release(bench, args, rows)
        logged = [line for line in bench.logged if line.strip()]
    print(
        f"bench.workflows on this machine, load average {load_average()}, "
        f"{time.monotonic() - started:.0f} s"
    )
    print_table(
        rows,
        "no-op steps; drains by `forklift run --workers 2`; rates from first start to last end",
    )
    print_plan(plan, args.blocked)
    if logged:
        print(f"\nforklift logged {len(logged)} line(s) at WARNING or above; the last 30:")
        for line in logged[-30:]:
            print(f"  {line[:300]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
