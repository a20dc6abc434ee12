"""Migration: how long the latest online migration holds off writes on a big jobs table.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.migration                  # 10,000,000 jobs
    .venv/bin/python -m bench.migration --rows 1000000

It migrates a fresh schema, puts it back to the schema before the online migrations
(forklift/schema: their indexes dropped, the ones they drop built again, their records
deleted), fills the jobs table with --rows jobs (finished ones, as a day's retention
keeps, and --ready ready ones) and analyzes it. Then it applies the online migrations
twice, each time from that same state: as a plain transaction (how every migration ran
before, the table's writes held off while each index builds) and as forklift migrate
now runs them on a table that big (CREATE INDEX CONCURRENTLY, outside a transaction).
Meanwhile a producer enqueues a job every 10 ms. Per run it prints the migration's
seconds, the producer's slowest enqueue during it and how many it made. It drops its
schema at the end.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

if not __package__:  # run as `python bench/migration.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import parser, positive, print_grid, say
from forklift import App
from forklift import schema as migrations

CHUNK = 1_000_000  # rows per INSERT while filling
EVERY = 0.01  # seconds between the producer's enqueues
# What the online migrations build, to undo them (their names as built), and drop (as
# they were before).
BUILT = (
    "jobs_ready_usual_idx", "jobs_ready_ranked_idx", "jobs_scheduled_idx", "jobs_ready_fair_idx",
    "jobs_ready_fair_key_idx", "jobs_ready_fair_late_idx", "jobs_ready_plain_idx",
    "jobs_ready_plain_ranked_idx", "jobs_ready_labelled_idx", "jobs_ready_open_idx",
    "jobs_ready_open_ranked_idx", "jobs_ready_unlabelled_idx",
)  # fmt: skip
DROPPED = {
    "jobs_available_idx": "(available_at) WHERE state = 'ready'",
    "jobs_ready_unlimited_idx": "(queue, priority DESC, available_at, id)"
    " WHERE state = 'ready' AND limit_key IS NULL",
}


def undo(conn: psycopg.Connection[Any], schema: str) -> None:
    """The schema as it was before the online migrations."""
    for name in BUILT:
        conn.execute(f'DROP INDEX IF EXISTS "{schema}".{name}')
    for name, definition in DROPPED.items():
        conn.execute(f'CREATE INDEX IF NOT EXISTS {name} ON "{schema}".jobs {definition}')
    online = [m.version for m in migrations.migrations() if m.online]
    conn.execute(f'DELETE FROM "{schema}".schema_migrations WHERE version = ANY(%s)', (online,))


def fill(conn: psycopg.Connection[Any], schema: str, rows: int, ready: int) -> None:
    for start in range(0, rows, CHUNK):
        n = min(CHUNK, rows - start)
        conn.execute(
            f"""INSERT INTO "{schema}".jobs (queue, task, args, state, attempts,
                    available_at, started_at, completed_at)
                SELECT 'default', 'noop', '{{}}', 'succeeded', 1,
                       now() - interval '1 day' + g * interval '1 ms',
                       now() - interval '1 day' + g * interval '1 ms',
                       now() - interval '1 day' + g * interval '1 ms'
                FROM generate_series(1, %s) AS g""",
            (n,),
        )
        say(f"filled {start + n:,} of {rows:,}")
    conn.execute(
        f"""INSERT INTO "{schema}".jobs (queue, task, args)
            SELECT 'default', 'noop', '{{}}' FROM generate_series(1, %s)""",
        (ready,),
    )
    conn.execute(f'VACUUM ANALYZE "{schema}".jobs')


def produce(app: App, stop: threading.Event, waits: list[float]) -> None:
    while not stop.is_set():
        began = time.perf_counter()
        app.enqueue("noop")
        waits.append(time.perf_counter() - began)
        stop.wait(max(0.0, EVERY - (time.perf_counter() - began)))


def run(app: App, online: bool) -> list[str]:
    """Apply the online migrations (concurrently if `online`) under the producer's load."""
    saved = migrations.ONLINE_ROWS
    migrations.ONLINE_ROWS = saved if online else sys.maxsize
    stop, waits = threading.Event(), list[float]()
    producer = threading.Thread(target=produce, args=(app, stop, waits))
    producer.start()
    time.sleep(1.0)  # its pool open, a steady pace
    before = len(waits)
    began = time.perf_counter()
    try:
        applied = app.migrate()
    finally:
        took = time.perf_counter() - began
        stop.set()
        producer.join()
        migrations.ONLINE_ROWS = saved
    during = waits[before:]
    how = "concurrently (forklift migrate)" if online else "in a transaction (as before)"
    say(f"{how}: applied {applied} in {took:.1f} s")
    return [how, f"{took:.1f}", f"{max(during) * 1000:,.0f}", f"{len(during):,}"]


def main(argv: Sequence[str] | None = None) -> int:
    p = parser("python -m bench.migration", __doc__)
    p.add_argument("--rows", type=positive, default=10_000_000, help="jobs (default 10M)")
    p.add_argument("--ready", type=positive, default=10_000, help="ready jobs among them")
    args: argparse.Namespace = p.parse_args(argv)
    schema = "bench_" + uuid.uuid4().hex[:8]
    app = App(args.dsn, schema=schema)
    app.task(name="noop")(_noop)
    app.migrate()
    try:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            undo(conn, schema)
            fill(conn, schema, args.rows, args.ready)
            cells = [["online migrations applied", "seconds", "slowest enqueue ms", "enqueues"]]
            for online in (False, True):
                undo(conn, schema)
                conn.execute(f'ANALYZE "{schema}".jobs')
                cells.append(run(app, online))
        print_grid(f"migration on {args.rows:,} jobs ({args.ready:,} ready)", cells)
    finally:
        app.close()
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    return 0


def _noop(ctx: Any) -> None:
    """The producer's task (never run here)."""


if __name__ == "__main__":
    raise SystemExit(main())
