"""A runnable CPU-heavy forklift app: count primes below N, store each answer once.

Everything lives in the app's own schema (FORKLIFT_SCHEMA), the answers table too, so
it never writes into anybody else's tables. From the repository root:

    export FORKLIFT_DATABASE_URL=postgresql://localhost/mydb FORKLIFT_SCHEMA=primes
    .venv/bin/forklift migrate
    .venv/bin/forklift run examples.primes:app --workers 2     # terminal 1: stays up
    .venv/bin/python examples/primes.py enqueue 200             # terminal 2
    .venv/bin/forklift status                                   # terminal 2
"""

from __future__ import annotations

import sys

import forklift

app = forklift.App()


def create_answers_table() -> None:
    with app.store.pool.connection() as conn:
        conn.execute(
            f'CREATE TABLE IF NOT EXISTS "{app.schema}".prime_counts '
            "(below integer PRIMARY KEY, n integer NOT NULL)"
        )


@app.task(queue="default", max_attempts=3, timeout=60.0)
def count_primes(ctx: forklift.JobContext, *, below: int) -> None:
    """Pure-Python CPU work (a sieve), then the answer and the job's completion commit
    together: a retry after a crash never stores it twice."""
    sieve = bytearray([1]) * below
    sieve[:2] = b"\x00\x00"
    for i in range(2, int(below**0.5) + 1):
        if sieve[i]:
            sieve[i * i :: i] = bytes(len(range(i * i, below, i)))
    with ctx.transaction() as conn:
        conn.execute(
            f'INSERT INTO "{app.schema}".prime_counts (below, n) VALUES (%s, %s)'
            " ON CONFLICT (below) DO UPDATE SET n = excluded.n",
            (below, sum(sieve)),
        )


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "enqueue" or not sys.argv[2].isdigit():
        sys.exit("usage: python examples/primes.py enqueue COUNT")
    create_answers_table()
    jobs = [
        forklift.JobSpec("count_primes", {"below": 2_000_000 + i}, idempotency_key=f"p{i}")
        for i in range(int(sys.argv[2]))
    ]
    print(f"enqueued {len(app.enqueue_many(jobs))} jobs (the same keys again add nothing)")
