"""The operator's and the metrics' queries on a big retained history: each ≤ 50 ms.

    python -m bench.queries [--rows 10_000_000] [--runs 7]

Fills a fresh schema with `--rows` finished jobs completed over the last day (2% dead,
1% cancelled; a day of retention at ~116 jobs/s for 10 M), 2,000 ready and 100 running
(tests/integration/test_query_plans.py's `fill`, which that test EXPLAINs), VACUUM
ANALYZEs it as autovacuum would, and says how long that took: 10 M rows take minutes
and ~4 GB of disk. Then every query of forklift/admin/queries.sql and admin/jobs.sql
runs with the test's realistic parameters, once untimed and `--runs` times timed, on one
open connection (writes inside a transaction that is rolled back), and so do the reads
the commands make (AdminStore.queue_stats as /metrics, `top` and `status` call it, each
on its own connection, connecting included). The table shows the median and the
slowest run of each; the target is a median ≤ 50 ms.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/queries.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import Bench, Row, parser, positive, print_table, say
from forklift import _sql
from forklift.admin import AdminStore
from tests.integration.test_query_plans import PARAMS, fill, with_cutoff

TARGET = 0.050  # seconds, per query
WRITES = {"queue_pause", "queue_resume", "job_retry_many", "job_cancel_many", "job_purge_batch"}


def timed(run: Callable[[], object], runs: int) -> list[float]:
    """Seconds of each of `runs` calls of `run`, after one untimed call."""
    run()
    took = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        took.append(time.perf_counter() - start)
    return took


def row(name: str, took: list[float]) -> Row:
    median = statistics.median(took)
    shown = f"{median * 1000:.1f} ms median, {max(took) * 1000:.1f} max"
    return Row(name, shown, f"<= {TARGET * 1000:.0f} ms", median <= TARGET)


def query_rows(bench: Bench, runs: int) -> list[Row]:
    """Each SQL query, each of its parameter sets, on the bench's open connection."""
    db = bench.db
    cutoff = bench.scalar("SELECT now() - interval '7 days'")
    rows = []
    for file in ("queries.sql", "jobs.sql"):
        for name, sql in _sql.load("forklift.admin", file, bench.schema).items():
            for n, params in enumerate(PARAMS.get(name, [{}])):
                bound = with_cutoff(params, cutoff)

                def run(sql: str = sql, bound: dict[str, Any] = bound, name: str = name) -> None:
                    # A write runs as it would, then is rolled back: the next run finds the
                    # same rows.
                    with db.transaction(force_rollback=name in WRITES):
                        cur = db.execute(sql, bound)
                        if cur.description is not None:
                            cur.fetchall()

                label = name if len(PARAMS.get(name, [])) < 2 else f"{name} #{n + 1}"
                rows.append(row(label, timed(run, runs)))
    return rows


def command_rows(bench: Bench, runs: int) -> list[Row]:
    """What /metrics, `top` and `status` read per refresh, connecting included."""
    admin = AdminStore(bench.dsn, bench.schema)
    calls: list[tuple[str, Callable[[], object]]] = [
        ("queue_stats as /metrics, progress", lambda: admin.queue_stats(throughput=False)),
        ("queue_stats as top", lambda: admin.queue_stats(hour=False)),
        ("queue_stats as status", lambda: admin.queue_stats()),
    ]
    return [row(name, timed(call, runs)) for name, call in calls]


def main(argv: list[str] | None = None) -> int:
    p = parser("python -m bench.queries", __doc__)
    p.add_argument("--rows", type=positive, default=10_000_000, help="finished jobs retained")
    p.add_argument("--runs", type=positive, default=7, help="timed runs of each query")
    args = p.parse_args(argv)
    with Bench(args.dsn, lambda app: app, "queries").session() as bench:
        start = time.monotonic()
        fill(
            bench.db,
            bench.schema,
            args.rows,
            lambda done: say(f"  {done:,} finished rows in, {time.monotonic() - start:.0f} s"),
        )
        setup = time.monotonic() - start
        size = bench.scalar("SELECT pg_size_pretty(pg_total_relation_size('{s}.jobs'))")
        say(f"setup: {args.rows:,} finished rows, VACUUM ANALYZE: {setup:.0f} s ({size})")
        rows = query_rows(bench, args.runs) + command_rows(bench, args.runs)
        rows.append(Row("setup (fill + VACUUM ANALYZE)", f"{setup:.0f} s, {size}"))
        print_table(rows, f"operator and metrics queries, {args.rows:,} finished jobs retained")
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
