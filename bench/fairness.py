"""Fair shares (issue 40): a noisy neighbour's backlog against nine small keys, what turns
cost a drain and an enqueue, and what they cost plain jobs of no fair task.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.fairness                    # ~5 minutes
    .venv/bin/python -m bench.fairness --quick            # ~2 minutes
    git -C . archive aba15d1 forklift | tar -x -C /tmp/forklift-before
    .venv/bin/python -m bench.fairness --baseline /tmp/forklift-before   # phase 3 too

Everything runs in a fresh schema `bench_<random>` (phase 3 adds one per version of
forklift), dropped at the end. Every drain is a `forklift run bench.fairness_app:app
--workers 2` at its defaults (concurrency 1), started for it; rates and waits are read
from the jobs' timestamps (the database's clock).

1. noisy neighbour. The handlers sleep --sleep-ms (20 ms): a known capacity (~100
   jobs/s, a few thousand waits a run) that the workers' own cost per job (~0.1 ms)
   hardly moves and the bench's producer, on the same 2 cores, does not compete for;
   long enough that a worker seldom claims ahead of its free slot (it claims what would
   start within 4 of its claim round trips: with claims under 5 ms, nothing), and each
   handler returns when it began, so the wait to the handler's start is reported beside
   the wait to the claim (`started_at`). Capacity: a calibration drain of 5 s of
   those sleeps, one key. Then three runs of --seconds (25), 2 s after the first claim, with
   the same seeded arrivals: nine small keys enqueue one by one, each a Poisson stream,
   together 10 % of capacity, while the big key keeps 1 s of capacity ready (topped up
   every 50 ms with enqueue_many: it offers all the capacity the small keys leave, and
   more). (a) the fair task; (b) the same load through a task not declared fair (plain
   first in, first out); (c) the fair task, the big key absent. A small job's wait is
   `started_at - available_at`, the claim's own `wait`; the runs go on, small keys
   silent, until every small job of the window has run. Reported: per small key
   p50 / p99 in each run; the worst small key's p99 (a) / (c), target <= 2x (and
   (b) / (c)); the jobs claimed after a small job was ready and before it (0: it took
   the first slot that freed); the big key's jobs/s in (a) against capacity less the
   small keys' (work-conserving: >= 0.9x).
2. drain: --jobs (20,000) no-ops over 100 keys of a fair task (enqueued round-robin)
   against as many of a plain task, alternately, --rounds (3) each: jobs/s from the
   first start to the last completion. Target: fair >= 0.8x plain. Also the enqueue:
   `enqueue_many` of --jobs fair jobs against plain ones (the trigger deals each row
   its turn), and 1,000 one-by-one `enqueue`s of each, alternately, --rounds each:
   jobs/s and ratios.
3. plain drain unchanged (with --baseline DIR, a directory holding another version's
   `forklift` package): the --jobs no-op drain of `bench.apps:app` (no fair task) by
   this tree against DIR's, each in its own schema migrated by its own version and
   filled by its own producer, alternately, --rounds each. Target: >= 0.97x.
4. what the schema costs plain jobs: the same drain, this tree's forklift, in a schema as
   migrated against one without the fair-turn triggers and the unique and fair partial
   indexes (every row written evaluates their predicates), alternately, --rounds each.
   Target: >= 0.97x. (Phase 3 compares two versions' processes too, which the machine's
   noise makes hard to read at a few per cent.)
5. under a held horizon: a backlog of 30,000 jobs of 100 keys, then 200 one-by-one
   `enqueue`s of keys with nothing waiting (ms each); then 20,000 of the backlog taken out
   of line (an UPDATE in line order, as claims move them) while a `REPEATABLE READ`
   transaction holds the horizon back, and the same enqueues again: fair task against
   plain. A fair job of a key with nothing waiting is dealt the head of the line's turn,
   which the trigger looks up from the start of the fair index, past the dead versions
   no vacuum may remove. No target: what it costs, for the next change to improve.

Before each drain and run the bench waits up to --quiet seconds for the rest of the
machine to go quiet. Every number is printed beside its target, in one table at the end.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

if not __package__:  # run as `python bench/fairness.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

import forklift
from bench import apps, fairness_app
from bench._harness import (
    REPO_ROOT,
    Bench,
    Command,
    ForkliftProcess,
    Row,
    load_average,
    non_negative_float,
    parser,
    percentile,
    positive,
    positive_float,
    print_table,
    say,
    stopped,
    wait_quiet,
)
from bench.cpu import HERE, Tree
from bench.fairness_app import FAIR_NAP, FAIR_NOOP, PLAIN_NAP, PLAIN_NOOP
from forklift.testing import wait_for

APP = "bench.fairness_app:app"
PLAIN_APP = "bench.apps:app"  # phase 3: no fair task, so that an older forklift loads it
BIG = "big"
SMALL = tuple(f"small{i}" for i in range(1, 10))
SMALL_SHARE = 0.10  # of capacity, the small keys together
BACKLOG_SECONDS = 1.0  # of capacity, the big key's ready jobs
TOP_UP_EVERY = 0.05  # seconds between the big key's top-ups
WARMUP = 2.0  # seconds of load before the measured window
CALIBRATION_SECONDS = 5.0  # of capacity, the calibration drain
SEED = 40
KEYS = 100  # phase 2's and 5's fair keys
HORIZON_BACKLOG, HORIZON_TAKEN, HORIZON_ENQUEUES = 30_000, 20_000, 200  # phase 5
ONE_BY_ONE = 1_000
P99_RATIO = 2.0
CONSERVING = 0.9
DRAIN_RATIO = 0.8
PLAIN_RATIO = 0.97
QUIET_CORES = 0.5
POLL = 0.2  # seconds between looks at a drain (its rate is the timestamps')
WAIT = 300.0  # seconds any drain may take before the bench gives up


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.1f}"


# -- the bench ---------------------------------------------------------------------------


class FairBench(Bench):
    """A schema migrated by `tree`'s forklift, its producer App, and the supervisor running
    (one at a time). Phase 3's baseline schema is migrated, filled and drained by the
    baseline's own forklift, in processes of their own."""

    def __init__(
        self,
        dsn: str,
        tree: Tree = HERE,
        register: Callable[[forklift.App], forklift.App] = fairness_app.register,
    ) -> None:
        super().__init__(dsn, register, f"fairness-{tree.label}")
        self.tree = tree
        self.supervisor: ForkliftProcess | None = None
        self.logged: list[str] = []  # what the stopped supervisors printed

    def create(self) -> None:
        if self.tree is HERE:
            self.app.migrate()
        else:
            self.run_tree("-m", "forklift", "migrate", "--log-level", "WARNING")

    def run_tree(self, *args: str) -> None:
        """`python ARGS` of this schema's tree, to its end; its output if it failed."""
        done = subprocess.run(
            self.tree.argv(*args),
            env=self.tree.env(self.env),
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"{self.tree.label}: {args} exited {done.returncode}: {done.stderr}")

    def reset(self) -> None:
        self.db.execute(f"TRUNCATE {self.schema}.jobs")

    def supervise(self, app: str = APP) -> None:
        """Start `forklift run APP --workers 2` of this schema's tree."""
        args = ("run", app, "--workers", "2", "--log-level", "WARNING")
        if self.tree is HERE:
            self.supervisor = self.start(*args)
        else:
            argv = self.tree.argv("-m", "forklift", *args)
            self.supervisor = Command(argv, self.tree.env(self.env), self.logdir)
            self.procs.append(self.supervisor)

    def stop_supervisor(self) -> None:
        """SIGTERM the supervisor and wait for it; keep what it printed."""
        if self.supervisor is not None:
            stopped(self.supervisor, self.logged)
            self.supervisor = None

    def now(self) -> datetime:
        """The database's clock."""
        value: datetime = self.scalar("SELECT clock_timestamp()")
        return value

    def drain(self, n: int, app: str = APP) -> float:
        """Drain the `n` jobs in the table with a supervisor started for them: jobs/s
        from the first start to the last completion."""
        self.db.execute(f"ANALYZE {self.schema}.jobs")
        self.supervise(app)
        supervisor = self.supervisor
        assert supervisor is not None

        def done() -> bool:
            supervisor.check_alive()
            return int(self.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")) >= n

        try:
            wait_for(done, WAIT, POLL, f"{n:,} jobs succeeded")
        finally:
            self.stop_supervisor()
        amiss = self.scalar("SELECT count(*) FROM {s}.jobs WHERE attempts <> 1")
        if amiss:
            raise RuntimeError(f"{amiss} jobs did not succeed at their first attempt")
        row = self.db.execute(
            f"SELECT count(*), extract(epoch FROM max(completed_at) - min(started_at))::float8"
            f" FROM {self.schema}.jobs"
        ).fetchone()
        assert row is not None
        return int(row[0]) / float(row[1])


# -- 1. noisy neighbour ------------------------------------------------------------------


@dataclass(frozen=True)
class Load:
    """What a run offers: `task`'s jobs of `seconds`, the big key's ready jobs kept at
    `backlog` (0: absent), the small keys' Poisson arrivals at `small_rate` in all."""

    task: str
    seconds: float
    backlog: int
    small_rate: float


class Producer:
    """The offered load, from one loop: each small key's seeded Poisson arrivals, one
    enqueue each, and the big key's top-ups to its backlog every TOP_UP_EVERY s."""

    def __init__(self, bench: FairBench, load: Load) -> None:
        self.bench = bench
        self.load = load
        self.rng = random.Random(SEED)  # the same arrivals in every run
        self.each = load.small_rate / len(SMALL)
        start = time.monotonic()
        self.due = {key: start + self.rng.expovariate(self.each) for key in SMALL}
        self.top_up_at = start

    def top_up(self) -> None:
        """Enqueue big jobs until `backlog` jobs are ready (small ones counted too)."""
        ready = int(self.bench.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'ready'"))
        missing = self.load.backlog - ready
        if missing > 0:
            args = {"account": BIG, "seconds": self.load.seconds}
            self.bench.app.enqueue_many([(self.load.task, args)] * missing)

    def run(self, seconds: float, *, small: bool = True) -> None:
        """Offer the load for `seconds` (the small keys' only if `small`)."""
        until = time.monotonic() + seconds
        while (now := time.monotonic()) < until:
            if self.load.backlog and now >= self.top_up_at:
                self.top_up()
                self.top_up_at = now + TOP_UP_EVERY
            key = min(self.due, key=self.due.__getitem__)
            if now >= self.due[key]:
                if small:
                    args = {"account": key, "seconds": self.load.seconds}
                    self.bench.app.enqueue(self.load.task, args)
                self.due[key] += self.rng.expovariate(self.each)
                continue
            wake = min(self.due[key], self.top_up_at if self.load.backlog else until, until)
            time.sleep(max(0.0, wake - time.monotonic()))


@dataclass
class Outcome:
    """One run's measured window. Per small key its jobs' waits from ready to claim
    (`waits`) and to their handler's start (`began`); per small job the jobs claimed
    after it was ready and before it (`passed`), and the wait for the first claim of any
    job after it was ready (`floor`: the first slot that freed, which no order of claims
    beats); per job claimed in the window, its handler's start less its claim (`lags`);
    the big and small keys' claims a second."""

    waits: dict[str, list[float]] = field(default_factory=dict)
    began: dict[str, list[float]] = field(default_factory=dict)
    passed: list[int] = field(default_factory=list)
    floor: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    big_rate: float = 0.0
    small_rate: float = 0.0

    def worst(self, by: str = "waits") -> float:
        """The worst small key's p99 wait, to its claim (or "began": its start)."""
        waits: dict[str, list[float]] = getattr(self, by)
        return max(percentile(waits[key], 99) for key in SMALL)

    def pooled(self, by: str = "waits") -> list[float]:
        waits: dict[str, list[float]] = getattr(self, by)
        return [w for key in SMALL for w in waits[key]]


def read_outcome(bench: FairBench, window: tuple[datetime, datetime]) -> Outcome:
    """The jobs of the window (small ones by when they were ready, every one by when it
    was claimed) as an Outcome. The handlers' clock is the database's: the same host's."""
    rows = bench.db.execute(
        f"""SELECT args->>'account', extract(epoch FROM available_at)::float8,
                   extract(epoch FROM started_at)::float8, (result #>> '{{}}')::float8
            FROM {bench.schema}.jobs WHERE started_at IS NOT NULL""",
    ).fetchall()
    begin, end = (t.timestamp() for t in window)
    starts = sorted(r[2] for r in rows)
    out = Outcome(waits={key: [] for key in SMALL}, began={key: [] for key in SMALL})
    big = small = 0
    for account, ready, started, began in rows:
        if begin <= started < end:
            big += account == BIG
            small += account != BIG
            if began is not None:  # None: claimed ahead, released at the stop
                out.lags.append(began - started)
        if account != BIG and begin <= ready < end:
            out.waits[account].append(max(0.0, started - ready))
            out.began[account].append(max(0.0, began - ready))
            first = bisect.bisect_right(starts, ready)
            out.passed.append(max(0, bisect.bisect_left(starts, started) - first))
            out.floor.append(starts[first] - ready if first < len(starts) else 0.0)
    out.big_rate, out.small_rate = big / (end - begin), small / (end - begin)
    return out


def small_waiting(bench: FairBench) -> bool:
    """Whether a small key's job has not run yet."""
    query = "SELECT count(*) FROM {s}.jobs WHERE state <> 'succeeded' AND args->>'account' <> %s"
    return bool(bench.scalar(query, (BIG,)))


def noisy_run(bench: FairBench, load: Load, seconds: float) -> Outcome:
    """One run of phase 1 under a supervisor started for it."""
    bench.reset()
    producer = Producer(bench, load)
    if load.backlog:
        producer.top_up()  # the backlog is there before the first claim
    bench.supervise()
    supervisor = bench.supervisor
    assert supervisor is not None
    try:
        booted = time.monotonic() + 60
        while not bench.scalar("SELECT EXISTS (SELECT FROM {s}.jobs WHERE started_at IS NOT NULL)"):
            if time.monotonic() > booted:
                raise RuntimeError("no job claimed 60 s after the supervisor started")
            producer.run(POLL)
        producer.run(WARMUP)  # from its first claim
        window = bench.now()
        producer.run(seconds)
        closed = bench.now()
        supervisor.check_alive()
        deadline = time.monotonic() + 60
        while small_waiting(bench):  # the small keys silent, the big key's backlog kept
            if time.monotonic() > deadline:
                raise RuntimeError("small keys' jobs still waiting 60 s after the window")
            producer.run(POLL, small=False)
    finally:
        bench.stop_supervisor()
    return read_outcome(bench, (window, closed))


def calibrate(bench: FairBench, seconds: float) -> float:
    """Capacity: jobs/s of a drain of CALIBRATION_SECONDS of `seconds` sleeps, one key."""
    n = max(50, round(2 / seconds * CALIBRATION_SECONDS))
    bench.reset()
    bench.app.enqueue_many([(FAIR_NAP, {"account": BIG, "seconds": seconds})] * n)
    return bench.drain(n)


RUNS = {
    "a": "(a) fair, big key present",
    "b": "(b) plain FIFO, big key present",
    "c": "(c) fair, big key absent",
}


def phase_noisy(bench: FairBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 1's rows."""
    seconds = args.sleep_ms / 1000
    say(f"noisy neighbour: calibrating {args.sleep_ms:g} ms sleeps ...")
    wait_quiet(QUIET_CORES, args.quiet)
    capacity = calibrate(bench, seconds)
    backlog = math.ceil(capacity * BACKLOG_SECONDS)
    small_rate = capacity * SMALL_SHARE
    say(f"    capacity {capacity:,.1f} jobs/s; big backlog {backlog}, small {small_rate:.1f}/s")
    loads = {
        "a": Load(FAIR_NAP, seconds, backlog, small_rate),
        "b": Load(PLAIN_NAP, seconds, backlog, small_rate),
        "c": Load(FAIR_NAP, seconds, 0, small_rate),
    }
    found: dict[str, Outcome] = {}
    for run, load in loads.items():
        say(f"noisy neighbour: {RUNS[run]}, {args.seconds:g} s ...")
        wait_quiet(QUIET_CORES, args.quiet)
        found[run] = noisy_run(bench, load, args.seconds)
        say(f"    worst small key's p99 {ms(found[run].worst())} ms")
    noisy_rows(rows, capacity, args, found)


def noisy_rows(
    rows: list[Row], capacity: float, args: argparse.Namespace, found: dict[str, Outcome]
) -> None:
    """Phase 1's rows: the waits per small key and pooled, the targets, the checks."""
    a, b, c = found["a"], found["b"], found["c"]
    rows.append(
        Row(
            f"capacity: {args.sleep_ms:g} ms sleeps, one key, 2 workers x 1 (calibration drain)",
            f"{capacity:,.1f} jobs/s (ideal {2000 / args.sleep_ms:,.0f})",
        )
    )
    for key in SMALL:
        cells = " | ".join(
            f"{ms(percentile(o.waits[key], 50))} / {ms(percentile(o.waits[key], 99))}"
            f" ({len(o.waits[key])})"
            for o in (a, b, c)
        )
        rows.append(Row(f"{key}: wait to claim p50 / p99 ms (jobs), (a) | (b) | (c)", cells))
    for by, label in (("waits", "claim"), ("began", "handler start")):
        pooled = " | ".join(
            f"{ms(percentile(o.pooled(by), 50))} / {ms(percentile(o.pooled(by), 99))}"
            for o in (a, b, c)
        )
        rows.append(Row(f"all small keys: wait to {label} p50 / p99 ms, (a) | (b) | (c)", pooled))
    for by, label in (("waits", "to claim (started_at)"), ("began", "to handler start")):
        ratio = a.worst(by) / c.worst(by)
        rows.append(
            Row(
                f"worst small key's p99 wait {label}: (a) fair / (c) alone",
                f"{ratio:.2f}x ({ms(a.worst(by))} / {ms(c.worst(by))} ms)",
                f"<= {P99_RATIO:.2f}x",
                ratio <= P99_RATIO,
            )
        )
        rows.append(
            Row("  (b) plain FIFO / (c) alone", f"{b.worst(by) / c.worst(by):,.1f}x"
                f" ({ms(b.worst(by))} ms)")
        )  # fmt: skip
    floor_rows(rows, a, b)
    conserving_rows(rows, capacity, a)


def floor_rows(rows: list[Row], a: Outcome, b: Outcome) -> None:
    """How far each small job was from the first slot that freed after it was ready."""
    floor = percentile(a.floor, 99)
    rows.append(
        Row(
            "(a) the floor: wait to the first claim of any job after a small job was ready, p99",
            f"{ms(floor)} ms (a perfect claim order at saturation waits this long)",
        )
    )
    for label, o in (("(a)", a), ("(b)", b)):
        rows.append(
            Row(
                f"jobs claimed after a small job was ready, before it {label}: p50 / p99 / max",
                f"{percentile(o.passed, 50):.0f} / {percentile(o.passed, 99):.0f} / "
                f"{max(o.passed)}",
            )
        )


def conserving_rows(rows: list[Row], capacity: float, a: Outcome) -> None:
    """Work-conserving: the big key's share in (a); and how far claims ran ahead."""
    left = capacity - a.small_rate
    share = a.big_rate / left
    rows.append(
        Row(
            "big key's jobs/s in (a) / (capacity - small keys' jobs/s)",
            f"{share:.2f}x ({a.big_rate:,.1f} / ({capacity:,.1f} - {a.small_rate:,.1f}))",
            f">= {CONSERVING:.2f}x",
            share >= CONSERVING,
        )
    )
    rows.append(
        Row(
            "handler start - claim in (a), p50 / p99 (a job claimed ahead of a free slot)",
            f"{ms(percentile(a.lags, 50))} / {ms(percentile(a.lags, 99))} ms",
        )
    )


# -- 2. drain and enqueue ----------------------------------------------------------------


def specs(task: str, n: int) -> list[tuple[str, dict[str, str]]]:
    """`n` no-ops of `task`, their accounts round-robin over KEYS keys."""
    return [(task, {"account": f"k{i % KEYS}"}) for i in range(n)]


def rotated(items: Sequence[str], rounds: int) -> Iterator[tuple[int, str]]:
    """Each item once a round, the order rotated by one each round: (round, item)."""
    for r in range(rounds):
        turn = r % len(items)
        for item in [*items[turn:], *items[:turn]]:
            yield r, item


def enqueue_rates(bench: FairBench, n: int, rounds: int) -> dict[tuple[str, str], list[float]]:
    """Jobs/s of `enqueue_many` of `n` and of ONE_BY_ONE `enqueue`s, by (way, task)."""
    for task in (FAIR_NOOP, PLAIN_NOOP):  # the pool opened, the statements planned
        bench.app.enqueue_many(specs(task, 100))
        bench.app.enqueue(task, {"account": "k0"})
    found: dict[tuple[str, str], list[float]] = {}
    for _, task in rotated((FAIR_NOOP, PLAIN_NOOP), rounds):
        bench.reset()
        bulk = specs(task, n)
        started = time.perf_counter()
        bench.app.enqueue_many(bulk)
        found.setdefault(("bulk", task), []).append(n / (time.perf_counter() - started))
        bench.reset()
        single = specs(task, ONE_BY_ONE)
        started = time.perf_counter()
        for name, job_args in single:
            bench.app.enqueue(name, job_args)
        rate = ONE_BY_ONE / (time.perf_counter() - started)
        found.setdefault(("single", task), []).append(rate)
    bench.reset()
    return found


def trigger_cost(bench: FairBench, n: int) -> tuple[float, float]:
    """EXPLAIN ANALYZE of one INSERT of `n` fair rows over KEYS keys (rolled back): the
    milliseconds the turn-dealing trigger (jobs_fair_turn) took, and the statement."""
    insert = (
        f"EXPLAIN (ANALYZE, FORMAT JSON) INSERT INTO {bench.schema}.jobs (task, args, fair_key)"
        " SELECT %s, jsonb_build_object('account', 'k' || g %% %s), 'k' || g %% %s"
        " FROM generate_series(1, %s) AS g"
    )
    bench.reset()
    with bench.db.transaction(force_rollback=True):
        plan = bench.scalar(insert, (FAIR_NOOP, KEYS, KEYS, n))[0]
    spent = sum(
        t["Time"] for t in plan.get("Triggers", []) if t["Trigger Name"] == "jobs_fair_turn"
    )
    return float(spent), float(plan["Execution Time"])


def phase_drain(bench: FairBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 2's rows: the drains, then the enqueues."""
    n = args.jobs
    rates: dict[str, list[float]] = {}
    for r, task in rotated((FAIR_NOOP, PLAIN_NOOP), args.rounds):
        say(f"drain: round {r + 1} of {args.rounds}, {n:,} of {task} ...")
        bench.reset()
        bench.app.enqueue_many(specs(task, n))
        wait_quiet(QUIET_CORES, args.quiet)
        rates.setdefault(task, []).append(bench.drain(n))
        say(f"    {rates[task][-1]:,.0f} jobs/s")
    fair, plain = (statistics.median(rates[t]) for t in (FAIR_NOOP, PLAIN_NOOP))
    each = f"median of {args.rounds}"
    rows.append(
        Row(f"drain {n:,} no-ops over {KEYS} keys of a fair task ({each})", f"{fair:,.0f} jobs/s")
    )
    rows.append(Row(f"  the same of a plain task ({each})", f"{plain:,.0f} jobs/s"))
    rows.append(
        Row(
            "  fair / plain",
            f"{fair / plain:.2f}x",
            f">= {DRAIN_RATIO:.2f}x",
            fair / plain >= DRAIN_RATIO,
        )
    )
    enqueue_rows(bench, args, rows)


def enqueue_rows(bench: FairBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 2's enqueue rows: fair against plain, in bulk and one by one."""
    n, each = args.jobs, f"median of {args.rounds}"
    say(f"enqueue: {args.rounds} rounds of enqueue_many of {n:,} and {ONE_BY_ONE:,} one by one ...")
    wait_quiet(QUIET_CORES, args.quiet)
    found = enqueue_rates(bench, n, args.rounds)
    for way, label in (
        ("bulk", f"enqueue_many of {n:,}"),
        ("single", f"{ONE_BY_ONE:,} enqueue one by one"),
    ):
        fair, plain = (statistics.median(found[way, t]) for t in (FAIR_NOOP, PLAIN_NOOP))
        rows.append(
            Row(
                f"{label}: fair / plain ({each})",
                f"{fair / plain:.2f}x ({fair:,.0f} / {plain:,.0f} jobs/s)",
            )
        )
    spent, statement = trigger_cost(bench, n)
    rows.append(
        Row(
            f"  INSERT ... SELECT of {n:,} fair rows: the trigger dealing turns (EXPLAIN ANALYZE)",
            f"{spent / n * 1000:.1f} us a row ({spent:,.0f} of the statement's"
            f" {statement:,.0f} ms)",
        )
    )


# -- 3. the plain drain against a baseline -----------------------------------------------

# A tree's own producer: `python -c FILL N` enqueues N no-ops of bench.apps in one call.
FILL = (
    "import sys; from bench.apps import app; "
    "app.enqueue_many([('noop', {})] * int(sys.argv[1])); app.close()"
)


def plain_drains(
    benches: dict[str, FairBench], args: argparse.Namespace, phase: str
) -> dict[str, list[float]]:
    """The --jobs no-op drain of `bench.apps:app` in each of `benches`, filled by its own
    tree's producer, alternately, --rounds times each: jobs/s by label."""
    n = args.jobs
    rates: dict[str, list[float]] = {}
    for r, label in rotated(tuple(benches), args.rounds):
        say(f"{phase}: round {r + 1} of {args.rounds}, {n:,} no-ops, {label} ...")
        one = benches[label]
        one.reset()
        one.run_tree("-c", FILL, str(n))
        wait_quiet(QUIET_CORES, args.quiet)
        rates.setdefault(label, []).append(one.drain(n, PLAIN_APP))
        say(f"    {rates[label][-1]:,.0f} jobs/s")
    return rates


def phase_baseline(bench: FairBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 3's rows (a row saying it was skipped without --baseline)."""
    if args.baseline is None:
        rows.append(Row("plain no-op drain, this tree / --baseline", "skipped (no --baseline)"))
        return
    n = args.jobs
    trees = {"this": HERE, "baseline": Tree("baseline", args.baseline.resolve())}
    with contextlib.ExitStack() as stack:
        benches = {
            label: stack.enter_context(FairBench(bench.dsn, tree, apps.register).session())
            for label, tree in trees.items()
        }
        rates = plain_drains(benches, args, "baseline")
        bench.logged += [line for one in benches.values() for line in one.logged]
    this, before = (statistics.median(rates[label]) for label in trees)
    each = f"median of {args.rounds}"
    rows.append(
        Row(f"plain drain of {n:,} no-ops, no fair task, this tree ({each})", f"{this:,.0f} jobs/s")
    )
    rows.append(Row(f"  the same, {args.baseline} ({each})", f"{before:,.0f} jobs/s"))
    rows.append(
        Row(
            "  this / baseline",
            f"{this / before:.2f}x",
            f">= {PLAIN_RATIO:.2f}x",
            this / before >= PLAIN_RATIO,
        )
    )


# -- 4. what issue 40's schema costs plain jobs ------------------------------------------

# What migrations 0022-0024 add that a plain job's insert, claim and completion may pay
# for: the triggers that deal and take fair turns, and the partial indexes of unique and
# fair jobs (every row written evaluates their predicates). Dropped in phase 4's bare
# schema.
BARE = (
    "DROP TRIGGER jobs_fair_turn ON {s}.jobs",
    "DROP TRIGGER jobs_fair_turn_later ON {s}.jobs",
    "DROP INDEX {s}.jobs_unique_idx",
    "DROP INDEX {s}.jobs_unique_key_idx",
    "DROP INDEX {s}.jobs_ready_fair_idx",
    "DROP INDEX {s}.jobs_ready_fair_key_idx",
    "DROP INDEX {s}.jobs_ready_fair_late_idx",
)


def phase_bare(bench: FairBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 4's rows: the plain no-op drain in a schema as migrated against one without
    what migrations 0022-0024 add to every row's writes (BARE), this tree's forklift in
    both, alternately: the schema's share of phase 3's ratio, without the noise of two
    versions' processes."""
    n = args.jobs
    with contextlib.ExitStack() as stack:
        benches = {
            label: stack.enter_context(FairBench(bench.dsn, HERE, apps.register).session())
            for label in ("as migrated", "bare")
        }
        for statement in BARE:
            benches["bare"].db.execute(statement.format(s=benches["bare"].schema))
        rates = plain_drains(benches, args, "bare")
        bench.logged += [line for one in benches.values() for line in one.logged]
    full, bare = (statistics.median(rates[label]) for label in benches)
    each = f"median of {args.rounds}"
    rows.append(
        Row(f"plain drain of {n:,} no-ops, schema as migrated ({each})", f"{full:,.0f} jobs/s")
    )
    rows.append(
        Row(
            f"  the same, fair triggers and unique/fair indexes dropped ({each})",
            f"{bare:,.0f} jobs/s",
        )
    )
    rows.append(
        Row(
            "  as migrated / dropped",
            f"{full / bare:.2f}x",
            f">= {PLAIN_RATIO:.2f}x",
            full / bare >= PLAIN_RATIO,
        )
    )


# -- command line ------------------------------------------------------------------------


def newcomers_ms(bench: FairBench, task: str, tag: str) -> float:
    """Milliseconds per one-by-one `enqueue` of HORIZON_ENQUEUES jobs of `task`, each of
    a key with nothing waiting."""
    started = time.perf_counter()
    for i in range(HORIZON_ENQUEUES):
        bench.app.enqueue(task, {"account": f"{tag}-{i}"})
    return (time.perf_counter() - started) / HORIZON_ENQUEUES * 1000


def held_horizon(bench: FairBench, task: str) -> tuple[float, float]:
    """Phase 5 for `task`: newcomers_ms over the backlog, then after HORIZON_TAKEN of it
    were taken out of line under a held horizon."""
    bench.reset()
    for _ in range(0, HORIZON_BACKLOG, 1000):
        bench.app.enqueue_many(specs(task, 1000))
    bench.db.execute(f"VACUUM ANALYZE {bench.schema}.jobs")
    before = newcomers_ms(bench, task, "before")
    take = (
        f"UPDATE {bench.schema}.jobs SET state = 'cancelled' WHERE id IN ("
        f" SELECT id FROM {bench.schema}.jobs WHERE state = 'ready' AND task = %s"
        "  ORDER BY fair_turn, available_at, id LIMIT 1000)"
    )
    with psycopg.connect(bench.dsn) as holder:
        holder.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # the snapshot taken: the horizon held from here
        for _ in range(0, HORIZON_TAKEN, 1000):
            bench.db.execute(take, (task,))
        after = newcomers_ms(bench, task, "after")
        holder.rollback()
    bench.reset()
    return before, after


def phase_horizon(bench: FairBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """Phase 5's rows."""
    for task, what in ((FAIR_NOOP, "fair"), (PLAIN_NOOP, "plain")):
        say(f"held horizon: {what} ...")
        before, after = held_horizon(bench, task)
        rows.append(
            Row(
                f"enqueue of a new key, {what}: over {HORIZON_BACKLOG:,} waiting / after"
                f" {HORIZON_TAKEN:,} taken under a held horizon",
                f"{before:.2f} / {after:.2f} ms ({after / before:.1f}x)",
            )
        )


def build_parser() -> argparse.ArgumentParser:
    p = parser("bench.fairness", __doc__)
    p.add_argument("--quick", action="store_true", help="shorter runs, fewer and smaller drains")
    p.add_argument("--seconds", type=positive_float, help="phase 1's window per run (25; quick 10)")
    p.add_argument(
        "--sleep-ms",
        type=positive_float,
        default=20.0,
        help="phase 1's handler sleep (%(default)s)",
    )
    p.add_argument(
        "--jobs", type=positive, help="jobs per drain in phases 2 and 3 (20,000; quick 5,000)"
    )
    p.add_argument("--rounds", type=positive, help="drains of each kind (3; quick 2)")
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="phase 3: the forklift package in DIR against this tree's",
    )
    p.add_argument(
        "--phases",
        default="1,2,3,4,5",
        help="which phases to run, comma-separated (%(default)s; 3 needs --baseline)",
    )
    p.add_argument(
        "--quiet",
        type=non_negative_float,
        default=10.0,
        help="seconds to wait before each run for the rest of the machine to use less than"
        f" {QUIET_CORES} of a core (%(default)s)",
    )
    return p


def defaults(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    """Fill the options not given (the full run's values, or --quick's); check them."""
    full = {"seconds": 25.0, "jobs": 20_000, "rounds": 3}
    quick = {"seconds": 10.0, "jobs": 5_000, "rounds": 2}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.seconds < 5:
        p.error("--seconds must be at least 5: a small key enqueues about once a second")
    if not 1 <= args.sleep_ms <= 1000:
        p.error("--sleep-ms must be between 1 and 1000")
    if args.baseline and not (args.baseline / "forklift" / "__init__.py").exists():
        p.error(f"--baseline {args.baseline}: no forklift package in it")
    args.phases = set(args.phases.split(","))
    if not args.phases or not args.phases <= {"1", "2", "3", "4", "5"}:
        p.error("--phases takes 1, 2, 3, 4 and 5, comma-separated")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = defaults(p, p.parse_args(argv))
    rows: list[Row] = []
    started = time.monotonic()
    with FairBench(args.dsn).session() as bench:
        phases = (
            ("1", phase_noisy), ("2", phase_drain), ("3", phase_baseline), ("4", phase_bare),
            ("5", phase_horizon),
        )  # fmt: skip
        for phase, run in phases:
            if phase in args.phases:
                run(bench, args, rows)
        logged = [line for line in bench.logged if line.strip()]
    print(
        f"bench.fairness on this machine, load average {load_average()}, "
        f"{time.monotonic() - started:.0f} s"
    )
    print_table(
        rows,
        "waits from the jobs' timestamps (database clock); drains by `forklift run --workers 2`"
        " at defaults, rates from first start to last completion",
    )
    if logged:
        print(f"\nforklift logged {len(logged)} line(s) at WARNING or above; the last 30:")
        for line in logged[-30:]:
            print(f"  {line[:300]}")
    return 0 if all(row.met is not False for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
