"""Pressure: a fixed offered load through phases that press on PostgreSQL; what gives?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.pressure                     # 1,000 jobs/s, every phase
    .venv/bin/python -m bench.pressure --embedded          # the same on an embedded server
    .venv/bin/python -m bench.pressure --hold 120,600      # two horizon phases, 2 and 10 min
    .venv/bin/python -m bench.pressure --phases baseline,horizon,after --phase 30

It starts `forklift run bench.compare_app:app --workers 2` at its defaults, in a fresh
schema. A producer offers --rate jobs a second, in batches every 10 ms (enqueue_many),
each job carrying the producer's time.time(); the handler's first act stamps its own
(bench/_stamps.py), so latency = handler start - enqueue, one clock. The phases, in
order (--phases picks some, each --phase seconds long unless said):

  baseline   the load alone
  horizon    one session holds a transaction id, idle in transaction (a forgotten BEGIN
             in a shell, a long report), for --hold seconds: no dead row younger than
             it can be vacuumed away anywhere in the database. With --hold A,B the
             phase runs once per length, each followed by its `after`.
  after      the load alone again, right after a pressure phase: how soon is it back?
  readers    four REPEATABLE READ sessions scan forklift's jobs table over and over,
             each snapshot held 10 s (analytics on the OLTP path)
  overload   1.5x the rate
  kills      pg_terminate_backend of one of the workers' sessions every --kill-every
             seconds (a pooler's or an operator's kills, a failover's)

Per phase it prints: jobs offered and started (a job belongs to the phase that enqueued
it), the rate started against the rate offered, latency p50 / p95 / p99 / max of that
phase's jobs, the deepest ready backlog seen, the most dead tuples seen in the jobs table
and in forklift's other tables (pg_stat_user_tables, sampled every 2 s), jobs of the
phase with a failed attempt in their history (none should have one: no phase is the
jobs' fault), and, for an `after` phase, the seconds from its start until the p50 of each
second's jobs is back within 1.2x the baseline's and stays there. Targets (issue 36): in a
horizon or readers phase p50 <= 2x and p99 <= 3x the baseline's, dead tuples bounded
(not growing with the hold's length), and back within 1.2x in <= 10 s after it.
The machine's PostgreSQL may run with autovacuum = off (this one does): forklift's
maintenance vacuums the hot table itself, so both kinds of server are worth a run.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

if not __package__:  # run as `python bench/pressure.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    append_result,
    load_average,
    parser,
    percentile,
    positive_float,
    print_grid,
    say,
)
from bench.steady import StampReader, SteadyBench, produce, server

PHASES = ("baseline", "horizon", "after", "readers", "after", "overload", "kills", "after")
READERS = 4
READER_SNAPSHOT = 10.0  # seconds each reader's REPEATABLE READ transaction lasts
SAMPLE = 2.0  # seconds between looks at the tables
BACK_WITHIN = 1.2  # an `after` phase is back once each second's p50 is this x baseline's
BACK_FOR = 3  # ... for this many seconds in a row
RESULTS = Path(__file__).resolve().parent / "results" / "pressure.jsonl"


@dataclass
class Phase:
    """One phase of the run and what was seen in it."""

    name: str
    seconds: float
    rate: float
    first_key: int = 0
    offered: int = 0
    began: float = 0.0  # time.time() at its start
    latencies: list[float] = field(default_factory=list)
    by_second: dict[int, list[float]] = field(default_factory=dict)  # second -> latencies
    depth: int = 0  # the deepest ready backlog seen
    dead_jobs: int = 0  # the most dead tuples seen in the jobs table
    dead_other: int = 0  # ... in any other forklift table
    failed: int = 0  # its jobs with a failed attempt in their history
    killed: int = 0  # sessions terminated during it

    @property
    def label(self) -> str:
        return f"{self.name} {self.seconds:g}s" + ("" if self.name != "overload" else " 1.5x")


@contextlib.contextmanager
def looping(target: Callable[[threading.Event], None], count: int = 1) -> Iterator[None]:
    """`count` threads each running `target(stop)` while the block runs; `stop` is set
    as it ends, and the threads are waited for."""
    stop = threading.Event()
    threads = [threading.Thread(target=target, args=(stop,), daemon=True) for _ in range(count)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join()


class Sampler:
    """Every SAMPLE seconds, on a connection of its own: the ready backlog and the dead
    tuples of forklift's tables, kept as the most seen in the current phase."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema
        self.phase: Phase | None = None

    def run(self, stop: threading.Event) -> None:
        with psycopg.connect(self.dsn, autocommit=True) as db:
            while not stop.wait(SAMPLE):
                phase = self.phase
                if phase is None:
                    continue
                depth = db.execute(
                    f"SELECT count(*) FROM {self.schema}.jobs WHERE state = 'ready'"
                ).fetchone()
                dead = db.execute(
                    "SELECT relname, n_dead_tup FROM pg_stat_user_tables WHERE schemaname = %s",
                    (self.schema,),
                ).fetchall()
                phase.depth = max(phase.depth, int(depth[0]) if depth else 0)
                for table, n in dead:
                    if table == "jobs":
                        phase.dead_jobs = max(phase.dead_jobs, int(n))
                    else:
                        phase.dead_other = max(phase.dead_other, int(n))


@contextlib.contextmanager
def horizon(dsn: str) -> Iterator[None]:
    """One session holding a transaction id, idle in transaction, until the block ends."""
    with psycopg.connect(dsn) as held:
        held.execute("SELECT txid_current()")  # an xid, not only a snapshot
        try:
            yield
        finally:
            held.rollback()


@contextlib.contextmanager
def readers(dsn: str, schema: str) -> Iterator[None]:
    """READERS sessions scanning the jobs table in REPEATABLE READ, each snapshot held
    READER_SNAPSHOT seconds, until the block ends."""

    def read(stop: threading.Event) -> None:
        with psycopg.connect(dsn) as conn:
            conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            while not stop.is_set():
                until = time.monotonic() + READER_SNAPSHOT
                with conn.transaction():
                    while time.monotonic() < until and not stop.is_set():
                        conn.execute(
                            f"SELECT state, count(*), max(available_at) FROM {schema}.jobs"
                            " GROUP BY state"
                        ).fetchall()

    with looping(read, READERS):
        yield


@contextlib.contextmanager
def kills(dsn: str, every: float, phase: Phase) -> Iterator[None]:
    """pg_terminate_backend of one of the workers' sessions every `every` seconds."""
    rng = random.Random(7)

    def kill(stop: threading.Event) -> None:
        with psycopg.connect(dsn, autocommit=True) as db:
            while not stop.wait(every):
                pids = [
                    r[0]
                    for r in db.execute(
                        "SELECT pid FROM pg_stat_activity"
                        " WHERE application_name LIKE 'forklift-worker:%'"
                    )
                ]
                if pids:
                    db.execute("SELECT pg_terminate_backend(%s)", (rng.choice(pids),))
                    phase.killed += 1

    with looping(kill):
        yield


def pressing(phase: Phase, bench: SteadyBench, args: argparse.Namespace) -> Any:
    """What presses on the database during `phase` (a context manager)."""
    if phase.name == "horizon":
        return horizon(bench.dsn)
    if phase.name == "readers":
        return readers(bench.dsn, bench.schema)
    if phase.name == "kills":
        return kills(bench.dsn, args.kill_every, phase)
    return contextlib.nullcontext()


def plan(args: argparse.Namespace) -> list[Phase]:
    """The phases to run, in order; each horizon once per --hold, with its `after`."""
    phases: list[Phase] = []
    for name in args.phases:
        if name == "horizon":
            for hold in args.hold:
                phases += [Phase("horizon", hold, args.rate)]
                phases += [Phase("after", args.phase, args.rate)]
            continue
        if name == "after" and phases and phases[-1].name == "after":
            continue  # the horizon's own `after` is there already
        rate = args.rate * (1.5 if name == "overload" else 1.0)
        phases.append(Phase(name, args.phase, rate))
    return phases


def run(bench: SteadyBench, args: argparse.Namespace) -> list[Phase]:
    bench.start("run", "bench.compare_app:app", "--workers", "2", "--log-level", "WARNING")
    reader = StampReader(bench.stamps)
    phases = plan(args)
    key = 0

    def collect() -> None:
        for s in reader.new():
            k = int(s.key)
            for phase in phases:
                if phase.first_key <= k < phase.first_key + phase.offered:
                    phase.latencies.append(s.latency_ms)
                    second = int(s.enqueued_at - phase.began)
                    phase.by_second.setdefault(second, []).append(s.latency_ms)
                    break

    time.sleep(2.0)  # the workers' start
    sampler = Sampler(bench.dsn, bench.schema)
    with looping(sampler.run):
        for phase in phases:
            phase.first_key, phase.began = key, time.time()
            sampler.phase = phase
            say(f"{phase.label}: {phase.rate:,.0f} jobs/s; load average {load_average()}")
            looked = time.monotonic()
            with pressing(phase, bench, args):
                for sent in produce(bench.app, phase.rate, phase.seconds, key):
                    phase.offered = sent
                    if time.monotonic() - looked > 1.0:  # the stamps file, read as it grows
                        collect()
                        looked = time.monotonic()
            key += phase.offered
        sampler.phase = None
    deadline = time.monotonic() + 60  # the last phase's jobs: let them start
    while time.monotonic() < deadline and sum(len(p.latencies) for p in phases) < key:
        collect()
        time.sleep(0.2)
    collect()
    failed_attempts(bench, phases)
    bench.print_logged()
    return phases


def failed_attempts(bench: SteadyBench, phases: Sequence[Phase]) -> None:
    """Each phase's jobs with a failed attempt in their error history."""
    rows = bench.db.execute(
        f"SELECT (args->>'key')::bigint FROM {bench.schema}.jobs"
        " WHERE jsonb_array_length(errors) > 0 AND task = 'stamp'"
    ).fetchall()
    for (k,) in rows:
        for phase in phases:
            if phase.first_key <= k < phase.first_key + phase.offered:
                phase.failed += 1


def back_after(phase: Phase, baseline: Phase | None) -> float | None:
    """Seconds from the phase's start until each second's p50 is within BACK_WITHIN of
    the baseline's for BACK_FOR seconds in a row (None: never, within the phase)."""
    if baseline is None or not baseline.latencies:
        return None
    limit = BACK_WITHIN * percentile(baseline.latencies, 50)
    run_of = 0
    for second in range(int(phase.seconds)):
        values = phase.by_second.get(second)
        ok = bool(values) and percentile(values or [0.0], 50) <= limit
        run_of = run_of + 1 if ok else 0
        if run_of == BACK_FOR:
            return float(second + 1 - BACK_FOR)
    return None


def report(phases: Sequence[Phase], args: argparse.Namespace, name: str) -> dict[str, Any]:
    baseline = next((p for p in phases if p.name == "baseline"), None)
    header = (
        "phase", "offered/s", "started/s", "p50 ms", "p95 ms", "p99 ms", "max ms",
        "ready (max)", "dead: jobs", "dead: other", "failed", "back in",
    )  # fmt: skip
    cells: list[tuple[str, ...]] = [header]
    rows = []
    for p in phases:
        lat = p.latencies or [math.nan]
        back = back_after(p, baseline) if p.name == "after" else None
        row = {
            "phase": p.label,
            "offered_per_s": p.offered / p.seconds,
            "started_per_s": len(p.latencies) / p.seconds,
            "p50_ms": percentile(lat, 50),
            "p95_ms": percentile(lat, 95),
            "p99_ms": percentile(lat, 99),
            "max_ms": max(lat),
            "ready_max": p.depth,
            "dead_jobs_max": p.dead_jobs,
            "dead_other_max": p.dead_other,
            "failed": p.failed,
            "back_in_s": back,
            "killed": p.killed,
        }
        rows.append(row)
        cells.append(
            (
                p.label + (f" ({p.killed} killed)" if p.name == "kills" else ""),
                f"{row['offered_per_s']:,.0f}",
                f"{row['started_per_s']:,.0f}",
                f"{row['p50_ms']:.1f}",
                f"{row['p95_ms']:.1f}",
                f"{row['p99_ms']:.1f}",
                f"{row['max_ms']:,.0f}",
                f"{p.depth:,}",
                f"{p.dead_jobs:,}",
                f"{p.dead_other:,}",
                str(p.failed),
                "-" if p.name != "after" else ("never" if back is None else f"{back:g} s"),
            )
        )
    print_grid(f"pressure {args.rate:,.0f} jobs/s, {name}", cells, right_align=True)
    print(f"load average at the end: {load_average()}")
    return {"server": name, "rate": args.rate, "phases": rows}


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.pressure", __doc__)
    p.add_argument("--rate", type=positive_float, default=1000.0, help="jobs/s offered (1000)")
    p.add_argument("--phase", type=positive_float, default=60.0, help="seconds a phase (60)")
    p.add_argument(
        "--hold",
        type=seconds_list,
        default=[120.0],
        help="seconds the horizon is held, one phase per value: 120 or 120,600 (120)",
    )
    p.add_argument(
        "--phases",
        type=phase_list,
        default=list(PHASES),
        help=f"the phases, in order ({','.join(PHASES)})",
    )
    p.add_argument(
        "--kill-every", type=positive_float, default=2.0, help="seconds between kills (2)"
    )
    p.add_argument(
        "--embedded", action="store_true", help="run on an embedded PostgreSQL, not --dsn"
    )
    p.add_argument(
        "--results", type=Path, default=RESULTS, help=f"append a JSON row here ({RESULTS})"
    )
    return p


def seconds_list(text: str) -> list[float]:
    return [positive_float(part) for part in text.split(",")]


def phase_list(text: str) -> list[str]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = sorted(set(names) - set(PHASES))
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown phase {', '.join(unknown) or '(none given)'}: the phases are "
            f"{', '.join(sorted(set(PHASES)))}"
        )
    return names


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with server(args) as (dsn, name):
        with SteadyBench(dsn).session() as bench:
            setting = bench.scalar("SELECT current_setting('autovacuum')")
            version = bench.scalar("SELECT current_setting('server_version')")
            say(f"{name}: PostgreSQL {version}, autovacuum = {setting}; pid {os.getpid()}")
            phases = run(bench, args)
        label = f"{name}, PostgreSQL {version}, autovacuum = {setting}"
        result = report(phases, args, label)
    append_result(args.results, {**result, "hold": args.hold, "phase_s": args.phase})
    return 0


if __name__ == "__main__":
    sys.exit(main())
