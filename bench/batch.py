"""Batches and results: what fanning out, fanning in and waiting cost.

    .venv/bin/python -m bench.batch                  # ~1 minute
    .venv/bin/python -m bench.batch --jobs 100000    # 100,000 jobs a drain

In one fresh schema, with one `forklift run bench.apps:app --workers 2` supervisor at
its defaults:

1. drain: N no-op jobs enqueued as plain jobs, then N as one batch (with a no-op
   callback), alternately, --rounds times each; the clock runs from the first claim to
   the last completion (database clock: min(started_at) to max(completed_at)). The
   batch's rate should be >= 0.9x the plain one.
2. callback delay: for each batch drained, and for --small batches of 20 jobs enqueued
   one after another, the time from its last job's completion to its callback's enqueue
   (the callback's created_at): median <= 0.1 s.
3. result latency: a job that sleeps 20 ms is waited for with app.result() called about
   1 ms before it completes; the time from its completion (completed_at) to result()
   returning, on the one clock of this host: median <= 5 ms.

Every phase checks that no job failed or ran twice, and that each callback ran once.
"""

from __future__ import annotations

import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

if not __package__:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import Bench, Row, load_average, parser, positive, print_table, say
from bench.apps import register
from forklift.store import ClaimedJob
from forklift.testing import wait_for
from forklift.workers.context import JobContext


class BatchBench(Bench):
    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "batch")

    def reset(self) -> None:
        self.db.execute(f"TRUNCATE {self.schema}.jobs, {self.schema}.batches")

    def drained(self, n: int) -> float:
        """Wait until `n` jobs succeeded; their rate from first start to last completion."""
        wait_for(
            lambda: self.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'") >= n,
            timeout=600,
            interval=0.05,
            what=f"{n:,} jobs succeeded",
        )
        seconds = self.scalar(
            "SELECT extract(epoch FROM max(completed_at) - min(started_at)) FROM {s}.jobs"
        )
        return n / float(seconds)

    def check(self, n: int) -> None:
        bad = self.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE state <> 'succeeded' OR attempts <> 1"
        )
        total = self.scalar("SELECT count(*) FROM {s}.jobs")
        if bad or total != n:
            raise RuntimeError(f"{bad} jobs failed or ran twice; {total} jobs for {n}")

    def callback_delays(self) -> list[float]:
        """Per finished batch: seconds from its last job's end to its callback's enqueue;
        and that each batch has exactly one callback job."""
        rows = self.db.execute(
            f"SELECT b.id, c.created_at, (SELECT max(j.completed_at) FROM {self.schema}.jobs j "
            f"WHERE j.batch_id = b.id), (SELECT count(*) FROM {self.schema}.jobs k "
            f"WHERE k.idempotency_key = 'forklift:batch:' || b.id) "
            f"FROM {self.schema}.batches b JOIN {self.schema}.jobs c ON c.id = b.callback_job_id"
        ).fetchall()
        if any(r[3] != 1 for r in rows):
            raise RuntimeError("a batch has more than one callback job")
        return [(created - last).total_seconds() for _, created, last, _ in rows]


def drain(bench: BatchBench, n: int, batch: bool) -> float:
    bench.reset()
    jobs: list[tuple[str, dict[str, object]]] = [("noop", {})] * n
    if batch:
        b = bench.app.enqueue_batch(jobs, on_complete="noop")
        rate = bench.drained(n)
        b.wait(timeout=60)
        bench.check(n + 1)
    else:
        bench.app.enqueue_many(jobs)
        rate = bench.drained(n)
        bench.check(n)
    say(f"  {'batch' if batch else 'plain'}: {rate:,.0f} jobs/s")
    return rate


def small_batches(bench: BatchBench, count: int) -> list[float]:
    bench.reset()
    for _ in range(count):
        bench.app.enqueue_batch([("noop", {})] * 20, on_complete="noop").wait(timeout=60)
    return bench.callback_delays()


def wait_started(bench: BatchBench, job_id: int) -> datetime:
    seen: list[datetime | None] = [None]

    def running() -> bool:
        seen[0] = bench.scalar("SELECT started_at FROM {s}.jobs WHERE id = %s", (job_id,))
        return seen[0] is not None

    wait_for(running, timeout=30, interval=0.0005, what="the job started")
    assert seen[0] is not None
    return seen[0]


def result_latency(bench: BatchBench, count: int) -> list[float]:
    """Seconds from each job's completion to app.result() returning its value."""
    bench.reset()
    nap = 0.02
    latencies = []
    for _ in range(count):
        job_id = bench.app.enqueue("nap", {"seconds": nap})
        started = wait_started(bench, job_id)
        # Call result() about 1 ms before the handler returns.
        time.sleep(max(0.0, started.timestamp() + nap - 0.001 - time.time()))
        value = bench.app.result(job_id, timeout=30)
        returned = time.time()
        assert value == "rested"
        completed: datetime = bench.scalar(
            "SELECT completed_at FROM {s}.jobs WHERE id = %s", (job_id,)
        )
        latencies.append(returned - completed.timestamp())
    return latencies


def progress_cost(bench: BatchBench, calls: int = 1_000_000) -> float:
    """Seconds one ctx.progress() call costs a handler (the write is another thread's)."""
    job = ClaimedJob(1, "default", "noop", {}, None, 0, 1, 5, None)
    ctx = JobContext(job, bench.app.store)
    started = time.perf_counter()
    for _ in range(calls):
        pass
    empty = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(calls):
        ctx.progress(i, calls)
    return max(0.0, time.perf_counter() - started - empty) / calls


def main() -> None:
    p = parser("bench.batch", __doc__)
    p.add_argument("--jobs", type=positive, default=30_000, help="jobs per drain (%(default)s)")
    p.add_argument("--rounds", type=positive, default=2, help="drains of each kind (%(default)s)")
    p.add_argument("--small", type=positive, default=30, help="20-job batches (%(default)s)")
    p.add_argument("--waits", type=positive, default=50, help="result() calls (%(default)s)")
    args = p.parse_args()
    with BatchBench(args.dsn).session() as bench:
        bench.start("run", "bench.apps:app", "--workers", "2", "--log-level", "WARNING")
        plain, batched = [], []
        say(f"drain: {args.jobs:,} no-ops, plain and as one batch, {args.rounds} rounds ...")
        delays: list[float] = []
        for _ in range(args.rounds):
            plain.append(drain(bench, args.jobs, batch=False))
            batched.append(drain(bench, args.jobs, batch=True))
            delays += bench.callback_delays()
        say(f"callback delay: {args.small} batches of 20 ...")
        delays += small_batches(bench, args.small)
        say(f"result latency: {args.waits} waits ...")
        latencies = result_latency(bench, args.waits)
        per_call = progress_cost(bench)
    p_rate, b_rate = statistics.median(plain), statistics.median(batched)
    delay, latency = statistics.median(delays), statistics.median(latencies)
    print(f"bench.batch on this machine, load average {load_average()}")
    print_table(
        [
            Row(f"{args.jobs:,} plain no-ops, drain (median)", f"{p_rate:,.0f} jobs/s"),
            Row(f"{args.jobs:,} no-ops as one batch", f"{b_rate:,.0f} jobs/s"),
            Row("  batch / plain", f"{b_rate / p_rate:.2f}x", ">= 0.90x", b_rate >= 0.9 * p_rate),
            Row(
                f"callback enqueued after the last job (median of {len(delays)})",
                f"{delay * 1000:.1f} ms",
                "<= 100 ms",
                delay <= 0.1,
            ),
            Row(
                f"app.result() after the completion (median of {len(latencies)})",
                f"{latency * 1000:.1f} ms",
                "<= 5 ms",
                latency <= 0.005,
            ),
            Row(
                "ctx.progress() 100,000 times a second: share of the handler's time",
                f"{per_call * 100_000:.1%} ({per_call * 1e9:.0f} ns a call)",
                "<= 5 %",
                per_call * 100_000 <= 0.05,
            ),
        ],
        "2 workers at their defaults (forklift run); rates from first start to last completion",
    )


if __name__ == "__main__":
    main()
