"""Enqueue against PostgreSQL's own floor: forklift's producer beside the bare statements.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.enqueue
    .venv/bin/python -m bench.enqueue --rounds 5 --bulk 50000

In a fresh schema, the bare floor writes to `bare_jobs`, made `LIKE jobs INCLUDING ALL`
(the same columns, defaults, constraints and indexes, no trigger), with the statements a
hand-written producer would send; forklift enqueues into `jobs` through `App`, with its
validation (names, JSON), its limits lookup and its wake-up of the workers. No worker
runs: the jobs stay where they are put. Three cases, each --rounds times, the tables
emptied before each round; the medians of the rounds are shown, the ratio being the
median of each round's own ratio:

1. bulk         --bulk no-op jobs (20,000) in batches of 1,000: `App.enqueue_many`
                (COPY) vs a bare `COPY bare_jobs (queue, task, args) FROM STDIN` of the
                same rows, one transaction a batch. Target >= 0.85x.
2. one by one   --single jobs (2,000), one call each, one producer: `App.enqueue` vs a
                bare autocommit `INSERT ... (queue, task, args)`. Target >= 0.85x.
3. 8 producers  --threads (8) threads, --single jobs each, one by one, each its own
                connection (forklift: each thread its own App): the total rate vs the
                same from 8 bare threads. Target >= 0.8x.

Cases 1 and 2 alternate the two sides slice by slice (a batch of 1,000; 100 calls),
the side that goes first swapped every slice: a virtual machine's speed drifts by tens
of percent from one minute to the next, and both sides then see the same drift. Case 3
alternates whole runs (its threads start together), the order swapped each round.

The table goes to stdout (rates, ratios, targets), progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

if not __package__:  # run as `python bench/enqueue.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

import forklift
from bench._harness import Bench, Row, load_average, parser, positive, print_table, say

BATCH = 1000
CALLS = 100  # one producer's slice of the one-by-one case


def register(app: forklift.App) -> forklift.App:
    @app.task(name="noop")
    def noop(ctx: forklift.JobContext, *, n: int = 0) -> None:
        """Never run here: the bench only enqueues."""

    return app


class EnqueueBench(Bench):
    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "enqueue")
        self.bare = f"{self.schema}.bare_jobs"

    def create(self) -> None:
        super().create()
        self.db.execute(f"CREATE TABLE {self.bare} (LIKE {self.schema}.jobs INCLUDING ALL)")

    def empty(self) -> None:
        self.db.execute(f"TRUNCATE {self.schema}.jobs, {self.bare}")

    # -- bulk ------------------------------------------------------------------------

    def bulk(self, n: int, forklift_first: bool) -> tuple[float, float]:
        """Jobs/s of forklift's and the bare bulk enqueue, batch by batch alternately."""
        copy_sql = f"COPY {self.bare} (queue, task, args) FROM STDIN"
        with psycopg.connect(self.dsn, autocommit=True) as conn:

            def ours(done: int) -> None:
                self.app.enqueue_many([("noop", {"n": done + i}) for i in range(BATCH)])

            def bare(done: int) -> None:
                with conn.transaction(), conn.cursor().copy(copy_sql) as copy:
                    for i in range(BATCH):
                        copy.write_row(("default", "noop", json.dumps({"n": done + i})))

            return _alternated(ours, bare, range(0, n, BATCH), BATCH, forklift_first)

    # -- one by one --------------------------------------------------------------------

    def single(self, n: int, forklift_first: bool) -> tuple[float, float]:
        """Jobs/s of one producer's enqueues, forklift's and bare, CALLS at a time."""
        insert = f"INSERT INTO {self.bare} (queue, task, args) VALUES (%s, %s, %s)"
        app = register(forklift.App(self.dsn, schema=self.schema))
        app.enqueue("noop", {"n": -1})  # connected (and its limits read) before the clock
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn:

                def ours(done: int) -> None:
                    for k in range(done, done + CALLS):
                        app.enqueue("noop", {"n": k})

                def bare(done: int) -> None:
                    for k in range(done, done + CALLS):
                        conn.execute(insert, ("default", "noop", json.dumps({"n": k})))

                return _alternated(ours, bare, range(0, n, CALLS), CALLS, forklift_first)
        finally:
            app.close()

    # -- many producers ----------------------------------------------------------------

    def forklift_single(self, n: int, threads: int) -> float:
        apps = [register(forklift.App(self.dsn, schema=self.schema)) for _ in range(threads)]
        try:
            for app in apps:  # connected (and its limits read) before the clock starts
                app.enqueue("noop", {"n": -1})

            def run(i: int) -> None:
                for k in range(n):
                    apps[i].enqueue("noop", {"n": k})

            return threads * n / _timed(run, threads)
        finally:
            for app in apps:
                app.close()

    def bare_single(self, n: int, threads: int) -> float:
        conns = [psycopg.connect(self.dsn, autocommit=True) for _ in range(threads)]
        insert = f"INSERT INTO {self.bare} (queue, task, args) VALUES (%s, %s, %s)"
        try:

            def run(i: int) -> None:
                for k in range(n):
                    conns[i].execute(insert, ("default", "noop", json.dumps({"n": k})))

            return threads * n / _timed(run, threads)
        finally:
            for conn in conns:
                conn.close()


def _timed(run: Callable[[int], None], threads: int) -> float:
    """Seconds for `threads` threads to each run `run(i)`, started together."""
    go = threading.Barrier(threads + 1)
    errors: list[BaseException] = []

    def body(i: int) -> None:
        go.wait()
        try:
            run(i)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=body, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    go.wait()
    began = time.perf_counter()
    for w in workers:
        w.join()
    if errors:
        raise errors[0]
    return time.perf_counter() - began


def _alternated(
    ours: Callable[[int], None],
    bare: Callable[[int], None],
    slices: Sequence[int],
    size: int,
    ours_first: bool,
) -> tuple[float, float]:
    """Jobs/s of `ours` and `bare`, each run on every slice start in `slices` (`size`
    jobs each), the two alternating, the first of each pair swapped every slice."""
    spent = {"ours": 0.0, "bare": 0.0}
    for k, done in enumerate(slices):
        pair = [("ours", ours), ("bare", bare)]
        for side, fn in pair if (k % 2 == 0) == ours_first else reversed(pair):
            began = time.perf_counter()
            fn(done)
            spent[side] += time.perf_counter() - began
    jobs = len(slices) * size
    return jobs / spent["ours"], jobs / spent["bare"]


Case = Callable[["EnqueueBench", bool], tuple[float, float]]  # (forklift, bare) jobs/s


def measure(args: argparse.Namespace) -> list[Row]:
    def many(b: EnqueueBench, forklift_first: bool) -> tuple[float, float]:
        rates = {}
        for side in ("forklift", "bare") if forklift_first else ("bare", "forklift"):
            b.empty()
            run = b.forklift_single if side == "forklift" else b.bare_single
            rates[side] = run(args.single, args.threads)
        return rates["forklift"], rates["bare"]

    cases: list[tuple[str, float, Case]] = [
        (
            f"bulk, {args.bulk:,} in COPY batches of {BATCH:,}",
            0.85,
            lambda b, first: b.bulk(args.bulk, first),
        ),
        (
            f"one by one, {args.single:,}, one producer",
            0.85,
            lambda b, first: b.single(args.single, first),
        ),
        (f"one by one, {args.threads} producer threads x {args.single:,}", 0.80, many),
    ]
    rates: dict[str, list[tuple[float, float]]] = {}
    with EnqueueBench(args.dsn).session() as bench:
        for r in range(args.rounds):
            for name, _, case in cases:
                bench.empty()
                ours, bare = case(bench, r % 2 == 0)
                rates.setdefault(name, []).append((ours, bare))
                say(f"round {r + 1}: {name}: forklift {ours:,.0f}, bare {bare:,.0f} jobs/s")
    rows: list[Row] = []
    for name, target, _ in cases:
        mine = statistics.median(o for o, _ in rates[name])
        floor = statistics.median(b for _, b in rates[name])
        ratio = statistics.median(o / b for o, b in rates[name])
        rows.append(Row(f"{name}: forklift", f"{mine:,.0f} jobs/s"))
        rows.append(Row(f"{name}: bare", f"{floor:,.0f} jobs/s"))
        rows.append(Row(f"{name}: ratio", f"{ratio:.2f}x", f">= {target:.2f}x", ratio >= target))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("python -m bench.enqueue", __doc__)
    p.add_argument("--rounds", type=positive, default=3, help="rounds of every case (3)")
    p.add_argument("--bulk", type=positive, default=20_000, help="jobs of the bulk case")
    p.add_argument("--single", type=positive, default=2_000, help="jobs per producer")
    p.add_argument("--threads", type=positive, default=8, help="producer threads (8)")
    args = p.parse_args(argv)
    load = load_average()
    rows = measure(args)
    print_table(
        rows,
        f"enqueue vs the bare statements, medians of {args.rounds} round(s); "
        f"load average {load} at start, {load_average()} at end",
    )
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
