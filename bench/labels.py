"""Worker labels (migrations 0025 and 0026): what they cost plain jobs when no task declares
any, a labelled drain against a plain one, and a plain drain beside a backlog that only
a host with other labels can take.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.labels              # ~6 minutes
    .venv/bin/python -m bench.labels --quick      # ~3 minutes
    .venv/bin/python -m bench.labels --phases 1 --rounds 9

Each phase runs in fresh schemas `bench_<random>` of its own, dropped at its end. Every
drain is a `forklift run bench.labels_app:app --workers 2` at its defaults (concurrency
1), started for it, with `--labels` and `--queues` as said; rates are read from the
jobs' timestamps (the database's clock): the jobs drained over the time from the first
start to the last completion. Drains of the kinds compared alternate, the order reversed
each round, and each kind's median is compared (this VM's speed drifts by tens of per
cent within minutes: compare the columns of one run). Per-round rates are printed too,
so that the spread of a ratio can be read beside it.

1. plain drain, no labels declared: --jobs (20,000) no-ops of a task that requires no
   labels, drained by workers without labels, in a schema as migrated against one with
   migration 0026 undone (jobs_ready_labelled_idx, jobs_ready_open_idx,
   jobs_ready_open_ranked_idx and jobs_ready_unlabelled_idx dropped; jobs_ready_plain_idx,
   jobs_ready_plain_ranked_idx and jobs_ready_unlimited_idx built again as migrations
   0024 and 0007 defined them), alternately,
   --rounds (7) each. The claim's SQL says `requires IS NULL` in both: with the old
   indexes it is a filter (the plan each schema's claim reads is printed). Target:
   >= 0.97x (labels cost nothing when unused).
2. labelled drain: --jobs no-ops of a task declared requires={"gpu"}, drained by workers
   started with --labels gpu (job_claim_labelled, before the plain claim), against as
   many plain no-ops drained by workers without labels, alternately, --other-rounds (3)
   each. No target: what the labelled claim costs. Each kind's claim is also timed
   once by EXPLAIN ANALYZE over a table of --jobs ready jobs of its kind, with what it
   read (an index, or the whole table).
3. beside a backlog nobody takes: --backlog (100,000) jobs requiring {"gpu"} ready in the
   same queue, enqueued before the drained ones (ahead in line), and no worker with that
   label; then (a) --jobs plain no-ops drained by workers without labels, against the
   same drain in a schema with no backlog, alternately, --other-rounds each (and against
   phase 1's plain rate); (b) --walk-jobs (10,000) plain no-ops drained by workers of two
   queues (--queues default,other: the general claim, job_claim, which a worker of one
   queue also makes every half lease to take back lost jobs), the same way; (c)
   --walk-jobs plain no-ops drained by workers with --labels gpu beside --backlog jobs
   requiring {"model-x"}, which they cannot take: their labelled claim reads past them
   through jobs_ready_labelled_idx (a known cost). For each backlog the claim each kind
   of worker makes is also timed once by EXPLAIN ANALYZE, with the index entries it read
   past; and every drain checks that the backlog is still all ready, none taken.

Before each drain the bench waits up to --quiet seconds for the rest of the machine to
go quiet. Every number is printed beside its target, in one table at the end, then each
comparison's rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/labels.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import labels_app
from bench._harness import (
    Bench,
    ForkliftProcess,
    Row,
    load_average,
    non_negative_float,
    parser,
    positive,
    print_grid,
    print_table,
    say,
    stopped,
    wait_quiet,
)
from bench.labels_app import GPU, GPU_NOOP, MODEL, MODEL_NOOP, PLAIN_NOOP
from forklift import _sql
from forklift.store import claim_statement
from forklift.testing import wait_for

APP = "bench.labels_app:app"
TARGET = 0.97  # phase 1: as migrated / 0026 undone
QUIET_CORES = 0.5
POLL = 0.2  # seconds between looks at a drain (its rate is the timestamps')
WAIT = 300.0  # seconds any drain may take before the bench gives up
FILL_CHUNK = 10_000  # jobs per enqueue_many of a backlog
EXPLAIN_JOBS = 1_000  # plain jobs ready beside a backlog when its claims are explained
EXPLAIN_LIMIT = 128  # jobs each explained claim asks for (a worker claiming ahead: 100-250)
# The indexes a claim reads its line of ready jobs from (as migrated, and 0026 undone).
LINES = (
    "jobs_ready_open_idx", "jobs_ready_open_ranked_idx", "jobs_ready_labelled_idx",
    "jobs_ready_unlabelled_idx", "jobs_ready_unlimited_idx", "jobs_ready_plain_idx",
    "jobs_ready_plain_ranked_idx",
)  # fmt: skip

# Migration 0026 undone: its four indexes dropped, and the three they replace (migration
# 0024's two of the plain claim, 0007's of every job no limit covers: without
# `requires IS NULL`) built again under their old names.
UNDO_0026 = (
    "DROP INDEX {s}.jobs_ready_labelled_idx",
    "DROP INDEX {s}.jobs_ready_open_idx",
    "DROP INDEX {s}.jobs_ready_open_ranked_idx",
    "DROP INDEX {s}.jobs_ready_unlabelled_idx",
    "CREATE INDEX jobs_ready_unlimited_idx ON {s}.jobs (queue, priority DESC, available_at, id)"
    " WHERE state = 'ready' AND limit_key IS NULL",
    "CREATE INDEX jobs_ready_plain_idx ON {s}.jobs (queue, available_at, id)"
    " WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND priority = 0",
    "CREATE INDEX jobs_ready_plain_ranked_idx ON {s}.jobs (queue, priority DESC, available_at, id)"
    " WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND priority <> 0",
)


@dataclass(frozen=True)
class Worker:
    """How the drain's `forklift run` is started: `--labels` and `--queues`."""

    labels: tuple[str, ...] = ()
    queues: tuple[str, ...] = ("default",)

    def args(self) -> tuple[str, ...]:
        labels = ("--labels", ",".join(self.labels)) if self.labels else ()
        return (*labels, "--queues", ",".join(self.queues))

    def claims(self) -> list[tuple[str, bool, tuple[str, ...]]]:
        """The claims such a worker makes, as (what, expired, labels): EXPLAIN's cases."""
        usual = "job_claim_one" if len(self.queues) == 1 else "job_claim"
        made: list[tuple[str, bool, tuple[str, ...]]] = [(usual, False, ())]
        if len(self.queues) == 1:
            made.append(("job_claim, every half lease (expired)", True, ()))
        if self.labels:
            made.insert(0, ("job_claim_labelled", False, self.labels))
        return made


PLAIN = Worker()


# -- the bench ---------------------------------------------------------------------------


class LabelBench(Bench):
    """A schema, its producer App (labels_app's tasks registered), and the supervisor
    draining it (one at a time); a `backlog` of jobs no drain takes stays across drains."""

    def __init__(self, dsn: str, label: str) -> None:
        super().__init__(dsn, labels_app.register, f"labels-{label}")
        self.label = label
        self.supervisor: ForkliftProcess | None = None
        self.logged: list[str] = []  # what the stopped supervisors printed
        self.backlog = 0

    def statements(self, *statements: str) -> None:
        for statement in statements:
            self.db.execute(statement.format(s=self.schema))

    def fill_backlog(self, task: str, n: int) -> None:
        """`n` jobs of `task`, which no drain of this bench takes; kept by `reset`."""
        for done in range(0, n, FILL_CHUNK):
            self.app.enqueue_many([(task, {})] * min(FILL_CHUNK, n - done))
        self.backlog += n
        self.statements("VACUUM ANALYZE {s}.jobs")

    def reset(self) -> None:
        """Every job gone but the backlog's (vacuumed away: autovacuum may be off)."""
        if not self.backlog:
            self.statements("TRUNCATE {s}.jobs")
            return
        self.statements("DELETE FROM {s}.jobs WHERE requires IS NULL", "VACUUM ANALYZE {s}.jobs")

    def fill(self, task: str, n: int) -> None:
        self.reset()
        self.app.enqueue_many([(task, {})] * n)

    def stop_supervisor(self) -> None:
        """SIGTERM the supervisor and wait for it; keep what it printed."""
        if self.supervisor is not None:
            stopped(self.supervisor, self.logged)
            self.supervisor = None

    def drain(self, task: str, n: int, worker: Worker) -> float:
        """Drain the `n` jobs of `task` in the table with a supervisor of `worker`'s
        started for them: jobs/s from the first start to the last completion. The
        backlog must be left as it was: all ready, none attempted."""
        self.statements("ANALYZE {s}.jobs")
        args = ("run", APP, "--workers", "2", "--log-level", "WARNING", *worker.args())
        supervisor = self.supervisor = self.start(*args)
        count = "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded' AND task = %s"

        def done() -> bool:
            supervisor.check_alive()
            return int(self.scalar(count, (task,))) >= n

        try:
            wait_for(done, WAIT, POLL, f"{n:,} jobs of {task} succeeded")
        finally:
            self.stop_supervisor()
        amiss = self.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE task = %s AND attempts <> 1", (task,)
        )
        if amiss:
            raise RuntimeError(f"{amiss} jobs of {task} did not succeed at their first attempt")
        touched = self.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE task <> %s"
            " AND (state <> 'ready' OR attempts <> 0)",
            (task,),
        )
        if touched:
            raise RuntimeError(
                f"{touched} jobs of the backlog were taken: a worker lacks their labels"
            )
        row = self.db.execute(
            f"SELECT count(*), extract(epoch FROM max(completed_at) - min(started_at))::float8"
            f" FROM {self.schema}.jobs WHERE task = %s",
            (task,),
        ).fetchone()
        assert row is not None
        return int(row[0]) / float(row[1])

    def explain(
        self, what: str, queues: Sequence[str], expired: bool, labels: Sequence[str]
    ) -> Any:
        """The plan (EXPLAIN ANALYZE, FORMAT JSON, rolled back) of the claim `what` of
        EXPLAIN_LIMIT jobs, as a worker of `queues` with `labels` makes it."""
        q = {
            **_sql.load("forklift.store", "queries.sql", self.schema),
            **_sql.load("forklift.store", "fair.sql", self.schema),
        }
        statement, params = claim_statement(
            q, queues, "bench", EXPLAIN_LIMIT, 30.0, expired, (), None, labels=labels
        )
        with self.db.transaction(force_rollback=True):
            row = self.db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params).fetchone()
        assert row is not None
        return row[0][0]


def plan_nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", []):
        yield from plan_nodes(child)


def indexes_read(plan: dict[str, Any]) -> list[str]:
    """What a plan reads its claim's line from, in plan order, each once: the indexes of
    ready jobs (not the looks at what falls due next or whether fair jobs wait), or the
    whole jobs table (a sequential scan, with the rows it read)."""
    read = []
    for n in plan_nodes(plan["Plan"]):
        if n.get("Index Name") in LINES:
            read.append(n["Index Name"])
        elif n["Node Type"] == "Seq Scan" and n.get("Relation Name") == "jobs":
            rows = (n["Actual Rows"] + n.get("Rows Removed by Filter", 0)) * n["Actual Loops"]
            read.append(f"Seq Scan on jobs, {rows:,} rows")
    return list(dict.fromkeys(read))


def read_past(plan: dict[str, Any]) -> int:
    """Index entries of jobs the plan's scans of the ready indexes read and filtered out."""
    return sum(
        int(n.get("Rows Removed by Filter", 0) * n.get("Actual Loops", 1))
        for n in plan_nodes(plan["Plan"])
        if n.get("Index Name", "").startswith("jobs_ready")
    )


# -- alternated drains -------------------------------------------------------------------


@dataclass
class Compared:
    """A comparison's rates, by kind, round by round (in the order run)."""

    title: str
    kinds: tuple[str, str]
    rates: dict[str, list[float]] = field(default_factory=dict)

    def median(self, kind: str) -> float:
        return statistics.median(self.rates[kind])

    @property
    def ratio(self) -> float:
        a, b = self.kinds
        return self.median(a) / self.median(b)

    @property
    def ratios(self) -> list[float]:
        """Each round's own ratio (its two drains ran back to back)."""
        a, b = self.kinds
        return [x / y for x, y in zip(self.rates[a], self.rates[b], strict=True)]

    def spread(self) -> str:
        ratios = self.ratios
        low, high = min(ratios), max(ratios)
        return f"{statistics.median(ratios):.2f}x ({low:.2f}-{high:.2f}x)"

    def grid(self) -> list[list[str]]:
        a, b = self.kinds
        cells = [["round", f"{a} jobs/s", f"{b} jobs/s", "ratio"]]
        for r, (x, y) in enumerate(zip(self.rates[a], self.rates[b], strict=True)):
            cells.append([str(r + 1), f"{x:,.0f}", f"{y:,.0f}", f"{x / y:.2f}x"])
        cells.append(["median", f"{self.median(a):,.0f}", f"{self.median(b):,.0f}", self.spread()])
        return cells


@dataclass(frozen=True)
class Drain:
    """One kind of drain: `n` jobs of `task` in `bench`, by workers of `worker`."""

    bench: LabelBench
    task: str
    n: int
    worker: Worker = PLAIN


def alternate(
    title: str, drains: dict[str, Drain], rounds: int, quiet: float, out: list[Compared]
) -> Compared:
    """Run the two `drains` alternately, `rounds` times each, the order rotated each round."""
    kinds = tuple(drains)
    assert len(kinds) == 2
    compared = Compared(title, (kinds[0], kinds[1]))
    for r in range(rounds):
        order = kinds if r % 2 == 0 else kinds[::-1]
        for kind in order:
            d = drains[kind]
            say(f"{title}: round {r + 1} of {rounds}, {d.n:,} of {d.task}, {kind} ...")
            d.bench.fill(d.task, d.n)
            wait_quiet(QUIET_CORES, quiet)
            compared.rates.setdefault(kind, []).append(d.bench.drain(d.task, d.n, d.worker))
            say(f"    {compared.rates[kind][-1]:,.0f} jobs/s")
    out.append(compared)
    return compared


@dataclass
class Run:
    """What the phases report: the table's rows, each comparison, and what forklift
    logged; phase 1's plain rate, for phase 3."""

    args: argparse.Namespace
    rows: list[Row] = field(default_factory=list)
    compared: list[Compared] = field(default_factory=list)
    logged: list[str] = field(default_factory=list)
    plain_rate: float | None = None


@contextlib.contextmanager
def benches(run: Run, *labels: str) -> Iterator[dict[str, LabelBench]]:
    """A LabelBench per label, each in its own schema, all dropped at the end."""
    with contextlib.ExitStack() as stack:
        made = {
            label: stack.enter_context(LabelBench(run.args.dsn, label).session())
            for label in labels
        }
        try:
            yield made
        finally:
            run.logged += [line for one in made.values() for line in one.logged]


def compared_rows(
    run: Run, compared: Compared, first: str, second: str, ratio: str, target: float | None = None
) -> None:
    """Four rows: each kind's median, their ratio (against `target`, if any), and the
    median and range of the rounds' own ratios (how far one reading can be trusted)."""
    a, b = compared.kinds
    run.rows.append(Row(first, f"{compared.median(a):,.0f} jobs/s"))
    run.rows.append(Row(second, f"{compared.median(b):,.0f} jobs/s"))
    value = f"{compared.ratio:.2f}x"
    if target is None:
        run.rows.append(Row(ratio, value))
    else:
        run.rows.append(Row(ratio, value, f">= {target:.2f}x", compared.ratio >= target))
    run.rows.append(Row("   the rounds' own ratios: median (range)", compared.spread()))


# -- 1. what labels cost when unused -----------------------------------------------------


def phase_unused(run: Run) -> None:
    """Phase 1's rows."""
    args = run.args
    n = args.jobs
    with benches(run, "as migrated", "0026 undone") as made:
        made["0026 undone"].statements(*UNDO_0026)
        plans = {}
        for label, bench in made.items():  # which indexes each schema's claim reads
            bench.fill(PLAIN_NOOP, n)
            bench.statements("ANALYZE {s}.jobs")
            plans[label] = indexes_read(bench.explain("job_claim_one", ["default"], False, ()))
        drains = {label: Drain(bench, PLAIN_NOOP, n) for label, bench in made.items()}
        compared = alternate("phase 1", drains, args.rounds, args.quiet, run.compared)
    run.plain_rate = compared.median("as migrated")
    each = f"median of {args.rounds}"
    compared_rows(
        run,
        compared,
        f"1. plain drain of {n:,} no-ops, no labels, schema as migrated ({each})",
        f"   the same, migration 0026 undone ({each})",
        "   as migrated / 0026 undone",
        TARGET,
    )
    for label, read in plans.items():
        run.rows.append(
            Row(f"   job_claim_one reads, {label}", ", ".join(read) or "(no ready index)")
        )


# -- the claims' plans --------------------------------------------------------------------


def explain_rows(
    run: Run,
    bench: LabelBench,
    worker: Worker,
    who: str,
    task: str = PLAIN_NOOP,
    jobs: int = EXPLAIN_JOBS,
    *,
    first: bool = False,
) -> None:
    """A row per claim `worker` makes (`first`: its first only), explained with `jobs`
    jobs of `task` ready (behind `bench`'s backlog, if any): its time, the index entries
    it read past, and what it read."""
    bench.fill(task, jobs)
    bench.statements("VACUUM ANALYZE {s}.jobs")
    claims = worker.claims()
    for what, expired, labels in claims[:1] if first else claims:
        plan = bench.explain(what.split(",")[0], list(worker.queues), expired, labels)
        run.rows.append(
            Row(
                f"   {who}: {what} of {EXPLAIN_LIMIT}, {jobs:,} ready, EXPLAIN ANALYZE",
                f"{plan['Execution Time']:.2f} ms, {read_past(plan):,} entries read past"
                f" ({'; '.join(indexes_read(plan))})",
            )
        )
    bench.reset()


# -- 2. a labelled drain against a plain one ---------------------------------------------


def phase_labelled(run: Run) -> None:
    """Phase 2's rows."""
    args = run.args
    n = args.jobs
    with benches(run, "drain") as made:
        bench = made["drain"]
        drains = {
            "labelled": Drain(bench, GPU_NOOP, n, Worker(labels=(GPU,))),
            "plain": Drain(bench, PLAIN_NOOP, n),
        }
        compared = alternate("phase 2", drains, args.other_rounds, args.quiet, run.compared)
        each = f"median of {args.other_rounds}"
        compared_rows(
            run,
            compared,
            f"2. drain of {n:,} no-ops requiring {{'{GPU}'}}, workers --labels {GPU} ({each})",
            f"   {n:,} plain no-ops, workers without labels ({each})",
            "   labelled / plain",
        )
        for drain in drains.values():  # each kind's claim over a full table of its jobs
            who = f"workers --labels {GPU}" if drain.worker.labels else "workers without labels"
            explain_rows(run, bench, drain.worker, who, drain.task, n, first=True)


# -- 3. beside a backlog nobody takes ----------------------------------------------------


def phase_backlog(run: Run) -> None:
    """Phase 3's rows."""
    args = run.args
    n, walk, backlog, rounds = args.jobs, args.walk_jobs, args.backlog, args.other_rounds
    each = f"median of {rounds}"
    two = Worker(queues=("default", "other"))
    gpu = Worker(labels=(GPU,))
    with benches(run, "gpu backlog", f"{MODEL} backlog", "no backlog") as made:
        say(
            f"phase 3: {backlog:,} jobs requiring {{'{GPU}'}} in a schema,"
            f" as many requiring {{'{MODEL}'}} in another ..."
        )
        made["gpu backlog"].fill_backlog(GPU_NOOP, backlog)
        made[f"{MODEL} backlog"].fill_backlog(MODEL_NOOP, backlog)
        cases = (
            ("3a", "gpu backlog", PLAIN, n, "workers without labels"),
            ("3b", "gpu backlog", two, walk, "workers of --queues default,other"),
            ("3c", f"{MODEL} backlog", gpu, walk, f"workers --labels {GPU}"),
        )
        for case, beside, worker, jobs, who in cases:
            drains = {
                "backlog": Drain(made[beside], PLAIN_NOOP, jobs, worker),
                "none": Drain(made["no backlog"], PLAIN_NOOP, jobs, worker),
            }
            compared = alternate(f"phase {case}, {who}", drains, rounds, args.quiet, run.compared)
            required = GPU if beside == "gpu backlog" else MODEL
            compared_rows(
                run,
                compared,
                f"{case}. {jobs:,} plain no-ops, {who},"
                f" beside {backlog:,} requiring {{'{required}'}} ({each})",
                f"   the same, no backlog ({each})",
                "   backlog / none",
            )
            if case == "3a" and run.plain_rate is not None:
                there = compared.median("backlog") / run.plain_rate
                run.rows.append(
                    Row("   backlog / phase 1's plain rate (as migrated)", f"{there:.2f}x")
                )
            explain_rows(run, made[beside], worker, who)


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = parser("bench.labels", __doc__)
    p.add_argument("--quick", action="store_true", help="fewer rounds, smaller drains and backlog")
    p.add_argument(
        "--jobs", type=positive, help="jobs per drain in phases 1, 2 and 3a (20,000; quick 5,000)"
    )
    p.add_argument("--rounds", type=positive, help="phase 1's drains of each schema (7; quick 3)")
    p.add_argument(
        "--other-rounds", type=positive, help="phases 2 and 3's drains of each kind (3; quick 2)"
    )
    p.add_argument(
        "--backlog",
        type=positive,
        help="phase 3's jobs that no worker takes (100,000; quick 30,000)",
    )
    p.add_argument(
        "--walk-jobs",
        type=positive,
        help="jobs per drain in phases 3b and 3c (10,000; quick 3,000)",
    )
    p.add_argument(
        "--phases", default="1,2,3", help="which phases to run, comma-separated (%(default)s)"
    )
    p.add_argument(
        "--quiet",
        type=non_negative_float,
        default=5.0,
        help="seconds to wait before each drain for the rest of the machine to use less than"
        f" {QUIET_CORES} of a core (%(default)s)",
    )
    return p  # fmt: skip


def defaults(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options not given (the full run's values, or --quick's); check them."""
    full = {"jobs": 20_000, "rounds": 7, "other_rounds": 3, "backlog": 100_000, "walk_jobs": 10_000}
    quick = {"jobs": 5_000, "rounds": 3, "other_rounds": 2, "backlog": 30_000, "walk_jobs": 3_000}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.phases = set(args.phases.split(","))
    if not args.phases or not args.phases <= {"1", "2", "3"}:
        p.error("--phases takes 1, 2 and 3, comma-separated")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    run = Run(defaults(p, p.parse_args(argv)))
    started = time.monotonic()
    for phase, body in (("1", phase_unused), ("2", phase_labelled), ("3", phase_backlog)):
        if phase in run.args.phases:
            body(run)
    logged = [line for line in run.logged if line.strip()]
    print(
        f"bench.labels on this machine, load average {load_average()}, "
        f"{time.monotonic() - started:.0f} s"
    )
    print_table(
        run.rows,
        "drains by `forklift run bench.labels_app:app --workers 2` at defaults, rates from"
        " first start to last completion",
    )
    for compared in run.compared:
        print_grid(f"{compared.title}: each round", compared.grid(), right_align=True)
    if logged:
        print(f"\nforklift logged {len(logged)} line(s) at WARNING or above; the last 30:")
        for line in logged[-30:]:
            print(f"  {line[:300]}")
    return 0 if all(row.met is not False for row in run.rows) else 1


if __name__ == "__main__":
    sys.exit(main())
