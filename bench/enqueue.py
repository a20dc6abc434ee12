"""Enqueue against PostgreSQL's own floor: forklift's producer beside the bare statements.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.enqueue
    .venv/bin/python -m bench.enqueue --rounds 5 --bulk 50000

In a fresh schema, the bare floor writes to `bare_jobs`, made `LIKE jobs INCLUDING ALL`
(the same columns, defaults, constraints and indexes, no trigger), with the statements a
hand-written producer would send; forklift enqueues into `jobs` through `App`, with its
validation (names, JSON), its limits lookup and its wake-up of the workers. No worker
runs: the jobs stay where they are put. Three cases, each --rounds times (interleaved,
the order rotated each round; the medians are shown), the tables emptied in between:

1. bulk         --bulk no-op jobs (20,000) in batches of 1,000: `App.enqueue_many`
                (COPY) vs a bare `COPY bare_jobs (queue, task, args) FROM STDIN` of the
                same rows, one transaction a batch. Target >= 0.85x.
2. one by one   --single jobs (2,000), one call each, one producer: `App.enqueue` vs a
                bare autocommit `INSERT ... (queue, task, args)`. Target >= 0.85x.
3. 8 producers  --threads (8) threads, --single jobs each, one by one, each its own
                connection (forklift: each thread its own App): the total rate vs the
                same from 8 bare threads. Target >= 0.8x.

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

    def forklift_bulk(self, n: int) -> float:
        began = time.perf_counter()
        for done in range(0, n, BATCH):
            self.app.enqueue_many([("noop", {"n": done + i}) for i in range(BATCH)])
        return n / (time.perf_counter() - began)

    def bare_bulk(self, n: int) -> float:
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            began = time.perf_counter()
            for done in range(0, n, BATCH):
                with conn.transaction():
                    copy_sql = f"COPY {self.bare} (queue, task, args) FROM STDIN"
                    with conn.cursor().copy(copy_sql) as copy:
                        for i in range(BATCH):
                            copy.write_row(("default", "noop", json.dumps({"n": done + i})))
            return n / (time.perf_counter() - began)

    # -- one by one --------------------------------------------------------------------

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


def measure(args: argparse.Namespace) -> list[Row]:
    cases: list[tuple[str, float, Callable[[EnqueueBench], float], Callable[[EnqueueBench], float]]]
    cases = [
        (
            f"bulk, {args.bulk:,} in COPY batches of {BATCH:,}",
            0.85,
            lambda b: b.forklift_bulk(args.bulk),
            lambda b: b.bare_bulk(args.bulk),
        ),
        (
            f"one by one, {args.single:,}, one producer",
            0.85,
            lambda b: b.forklift_single(args.single, 1),
            lambda b: b.bare_single(args.single, 1),
        ),
        (
            f"one by one, {args.threads} producer threads x {args.single:,}",
            0.80,
            lambda b: b.forklift_single(args.single, args.threads),
            lambda b: b.bare_single(args.single, args.threads),
        ),
    ]
    rates: dict[tuple[str, str], list[float]] = {}
    with EnqueueBench(args.dsn).session() as bench:
        for r in range(args.rounds):
            for name, _, ours, bare in cases:
                sides: Sequence[tuple[str, Callable[[EnqueueBench], float]]] = [
                    ("forklift", ours),
                    ("bare", bare),
                ]
                for side, fn in sides if r % 2 == 0 else list(reversed(sides)):
                    bench.empty()
                    rate = fn(bench)
                    rates.setdefault((name, side), []).append(rate)
                    say(f"round {r + 1}: {name}: {side} {rate:,.0f} jobs/s")
    rows: list[Row] = []
    for name, target, _, _ in cases:
        mine = statistics.median(rates[(name, "forklift")])
        floor = statistics.median(rates[(name, "bare")])
        rows.append(Row(f"{name}: forklift", f"{mine:,.0f} jobs/s"))
        rows.append(Row(f"{name}: bare", f"{floor:,.0f} jobs/s"))
        rows.append(Row(f"{name}: ratio", f"{mine / floor:.2f}x", f">= {target:.2f}x",
                        mine / floor >= target))  # fmt: skip
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
