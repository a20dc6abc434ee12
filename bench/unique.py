"""Unique jobs: what a unique enqueue costs against a plain one, one by one and in bulk.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.unique             # ~1 minute
    .venv/bin/python -m bench.unique --rounds 3  # quicker

In a fresh schema `bench_<random>` (dropped at the end), one App enqueues a no-op task
declared unique by its argument (forklift.Unique(keys=["n"])) and the same task
undeclared, each key new (the common case: a conflict inserts nothing and costs less):

1. one by one: --single (2,000) `enqueue` calls on one thread, jobs/s;
2. in bulk: --bulks (20) `enqueue_many` calls of 1,000 jobs each, jobs/s;
3. in bulk with replace: the same, on_conflict="replace" (a statement per job: the
   order that keeps bulk enqueues from deadlocking, forklift/store/_inserts.py).

Plain and unique runs alternate (A B A B ...), --rounds times each, the table emptied
before each run; the median of each is printed with the ratio unique / plain. Target:
>= 0.8x one by one and in bulk.
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

import forklift

LOCAL = "postgresql://root@127.0.0.1:5432/test"


def noop(ctx: forklift.JobContext, *, n: int) -> None:
    pass


def apps(dsn: str, schema: str) -> tuple[forklift.App, forklift.App]:
    """(plain, unique): two Apps of the schema, `noop` declared plain and unique."""
    plain = forklift.App(dsn, schema=schema)
    plain.task(name="noop")(noop)
    unique = forklift.App(dsn, schema=schema)
    unique.task(name="noop", unique=forklift.Unique(keys=["n"]))(noop)
    return plain, unique


def timed(run: Callable[[int], int], db: psycopg.Connection[Any], schema: str, base: int) -> float:
    """Jobs/s of `run(base)` (which returns how many it enqueued), on an emptied table."""
    db.execute(f"TRUNCATE {schema}.jobs")
    start = time.perf_counter()
    n = run(base)
    return n / (time.perf_counter() - start)


def single(app: forklift.App, count: int) -> Callable[[int], int]:
    def run(base: int) -> int:
        for i in range(count):
            app.enqueue("noop", {"n": base + i})
        return count

    return run


def bulk(app: forklift.App, bulks: int, policy: str | None) -> Callable[[int], int]:
    def run(base: int) -> int:
        for b in range(bulks):
            first = base + b * 1000
            specs = [
                forklift.JobSpec("noop", {"n": first + i}, on_conflict=policy)  # type: ignore[arg-type]
                for i in range(1000)
            ]
            app.enqueue_many(specs)
        return bulks * 1000

    return run


def compare(
    db: psycopg.Connection[Any], schema: str, plain: Callable[[int], int],
    unique: Callable[[int], int], rounds: int,
) -> tuple[float, float]:  # fmt: skip
    """Medians of `plain` and `unique`, alternated `rounds` times after a warm-up each."""
    timed(plain, db, schema, 0), timed(unique, db, schema, 0)
    a: list[float] = []
    b: list[float] = []
    for r in range(rounds):
        a.append(timed(plain, db, schema, (r + 1) * 10_000_000))
        b.append(timed(unique, db, schema, (r + 1) * 10_000_000))
    return statistics.median(a), statistics.median(b)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dsn", default=LOCAL)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--single", type=int, default=2000)
    parser.add_argument("--bulks", type=int, default=20)
    args = parser.parse_args(argv)
    schema = f"bench_{secrets.token_hex(4)}"
    forklift.App(args.dsn, schema=schema).migrate()
    plain, unique = apps(args.dsn, schema)
    try:
        with psycopg.connect(args.dsn, autocommit=True) as db:
            cases = [
                ("one by one", single(plain, args.single), single(unique, args.single)),
                ("bulk of 1,000", bulk(plain, args.bulks, None), bulk(unique, args.bulks, None)),
                (
                    "bulk of 1,000, replace",
                    bulk(plain, args.bulks, None),
                    bulk(unique, max(1, args.bulks // 4), "replace"),
                ),
            ]
            print(f"{'case':<24} {'plain jobs/s':>13} {'unique jobs/s':>14} {'ratio':>7}  target")
            for name, a, b in cases:
                p, u = compare(db, schema, a, b, args.rounds)
                target = "" if "replace" in name else ">= 0.8x"
                print(f"{name:<24} {p:>13,.0f} {u:>14,.0f} {u / p:>6.2f}x  {target}")
    finally:
        plain.close()
        unique.close()
        with psycopg.connect(args.dsn, autocommit=True) as db:
            db.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
