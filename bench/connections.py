"""Connections a `forklift run` holds: N workers x concurrency C, no-op jobs flowing.

    .venv/bin/python -m bench.connections
    .venv/bin/python -m bench.connections --workers 1 4 16 --concurrency 1 8

For each (N, C) it creates a database of its own, starts `forklift run bench.apps:app
--workers N --concurrency C` there, keeps no-op jobs flowing for --seconds, and counts
the backends of that database in pg_stat_activity every 0.1 s (the peak and the last),
against the target N + 2 (handlers that do not use ctx.transaction() open no connection
of their own). Each database is dropped after.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import psycopg

import forklift

SERVER = "postgresql://root@127.0.0.1:5432/"


def _count(admin: psycopg.Connection[Any], db: str) -> int:
    row = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
        (db,),
    ).fetchone()
    return int(row[0]) if row else 0


def measure(workers: int, concurrency: int, seconds: float, server: str) -> tuple[int, int]:
    """(peak, last) backends of a fresh database while `forklift run` works there."""
    db = f"bench_conns_{secrets.token_hex(3)}"
    with psycopg.connect(server + "postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{db}"')
        dsn = server + db
        try:
            app = forklift.App(dsn)
            app.migrate()
            env = dict(os.environ, FORKLIFT_DATABASE_URL=dsn, FORKLIFT_METRICS_ADDR="127.0.0.1:0")
            cmd = [sys.executable, "-m", "forklift", "run", "bench.apps:app"]
            cmd += ["--workers", str(workers), "--concurrency", str(concurrency)]
            proc = subprocess.Popen(
                cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
            )
            try:
                peak = last = 0
                deadline = time.monotonic() + seconds
                while time.monotonic() < deadline:
                    app.enqueue_many([("noop", {})] * 200)
                    last = _count(admin, db) - 1  # the producer's own connection
                    peak = max(peak, last)
                    time.sleep(0.1)
            finally:
                proc.terminate()
                proc.wait(timeout=60)
                app.close()
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{db}" WITH (FORCE)')
    return peak, last


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--server", default=SERVER, help="a server URL ending in '/'")
    args = parser.parse_args(argv)
    print(f"{'workers':>7} {'concurrency':>11} {'peak':>5} {'last':>5} {'target N+2':>10}")
    for n in args.workers:
        for c in args.concurrency:
            peak, last = measure(n, c, args.seconds, args.server)
            print(f"{n:>7} {c:>11} {peak:>5} {last:>5} {n + 2:>10}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
