"""The bare floor of enqueue-to-start latency: what PostgreSQL alone gives, no library.

A producer INSERTs a job and NOTIFYs in one statement; one consumer connection LISTENs,
and on each notification (or a 1 s fallback poll) claims jobs one at a time with
`UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING`, stamps
each one's start (bench._stamps) and marks it done. bench.compare runs the consumer as

    python -m bench.floor --dsn DSN --schema SCHEMA      # $BENCH_STAMPS names the file

and enqueues with `FloorQueue.enqueue`. It is the floor for every job queue here: each
adds its own bookkeeping (leases, attempts, heartbeats, logs) to these statements.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

if not __package__:  # run as `python bench/floor.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _stamps


class FloorQueue:
    """The floor's table `<schema>.floor_jobs` and its three statements."""

    def __init__(self, conn: psycopg.Connection[Any], schema: str) -> None:
        self.conn = conn  # autocommit
        self.table = f'"{schema}".floor_jobs'
        self.channel = f"{schema}_floor"

    def create(self) -> None:
        self.conn.execute(
            f"CREATE TABLE {self.table} (id bigserial PRIMARY KEY, args jsonb NOT NULL, "
            "done boolean NOT NULL DEFAULT false)"
        )
        self.conn.execute(f"CREATE INDEX ON {self.table} (id) WHERE NOT done")

    def enqueue(self, args: dict[str, Any]) -> None:
        """Insert one job and notify, one statement (one round trip, one commit)."""
        self.conn.execute(
            f"WITH job AS (INSERT INTO {self.table} (args) VALUES (%s) RETURNING id) "
            f"SELECT pg_notify('{self.channel}', '') FROM job",
            (Jsonb(args),),
        )

    def claim(self) -> dict[str, Any] | None:
        """The oldest job nobody holds, locked and marked taken (its args), or None."""
        row = self.conn.execute(
            f"UPDATE {self.table} SET done = true WHERE id = (SELECT id FROM {self.table} "
            "WHERE NOT done ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING args"
        ).fetchone()
        return None if row is None else dict(row[0])

    def consume(self) -> None:
        """LISTEN, then claim and stamp until empty, wait for a notification, and again."""
        self.conn.execute(f'LISTEN "{self.channel}"')
        while True:
            while (args := self.claim()) is not None:
                _stamps.stamp(args["key"], args["t"])
            for _ in self.conn.notifies(timeout=1.0, stop_after=1):
                pass


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.floor", description=__doc__)
    p.add_argument("--dsn", required=True)
    p.add_argument("--schema", required=True)
    args = p.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        FloorQueue(conn, args.schema).consume()
    return 0


if __name__ == "__main__":
    sys.exit(main())
