"""Throughput and latency benchmark for forklift against a real PostgreSQL.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.throughput               # every phase, ~1-2 minutes
    .venv/bin/python -m bench.throughput --skip-scale  # without the 1M-row phase
    .venv/bin/python -m bench.throughput --sweep 32,64,128  # pick the concurrency too

Phases, all in one fresh schema `bench_<random>` that is dropped at the end (also on
error, Ctrl-C or SIGTERM); the jobs table is truncated between phases:

1. enqueue: `app.enqueue("noop", {})` one call at a time from one client, then
   `app.enqueue_many` in batches (COPY).
2. processing: N no-op jobs are enqueued in bulk (then ANALYZE), W `forklift worker`
   processes with concurrency C are started, and the clock runs from their start until
   a count(*) of succeeded jobs, polled every 50 ms, reaches N. The rate between 10% and
   90% completion, which leaves out process boot and the tail, is reported too; so is
   the share of a core the polls themselves kept the server busy. Median of 3 runs.
3. latency: one idle worker (concurrency 1, LISTEN/NOTIFY on) gets jobs one at a time;
   the handler records clock_timestamp() and latency = started_at - jobs.created_at,
   both on the database clock.
4. scale: the processing rate (10-90%) of the first 10k jobs with 10k vs 1M ready jobs
   in the table (10k, since the small table holds no more).
5. retained (only with --retained N): the processing rate (10-90%) of 10k jobs with no
   finished jobs in the table vs with N succeeded ones kept (inserted by SQL into a
   second schema, as a day's retention keeps them, then VACUUM ANALYZE), rounds
   alternating between the two, progress polled on the ready and running indexes.

Every run checks that no job failed or ran twice. The machine and the server may be
shared: the header line gives the load average and autovacuum setting at the start.

No peer job queue is installed here, so there are no side-by-side peer numbers.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as `python bench/throughput.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    YES_NO,
    Bench,
    Row,
    load_average,
    parser,
    percentile,
    positive,
    positive_float,
    print_table,
    say,
)
from bench.apps import register
from forklift.testing import wait_for

# -- results -----------------------------------------------------------------------------


@dataclass
class Processing:
    """How long W workers took to finish `jobs` jobs, with the progress samples."""

    jobs: int
    workers: int
    concurrency: int
    seconds: float
    samples: list[tuple[float, int]] = field(default_factory=list)
    poll_seconds: float = 0.0  # spent in the progress count(*) queries

    @property
    def poll_load(self) -> float:
        """The share of one core the progress queries kept busy (they compete for CPU)."""
        return self.poll_seconds / self.seconds

    @property
    def rate(self) -> float:
        return self.jobs / self.seconds

    @property
    def steady_rate(self) -> float | None:
        """Jobs/s between 10% and 90% completion (process boot and the tail left out)."""
        lo = next((s for s in self.samples if s[1] >= 0.1 * self.jobs), None)
        hi = next((s for s in self.samples if s[1] >= 0.9 * self.jobs), None)
        if lo is None or hi is None or hi[0] <= lo[0]:
            return None
        return (hi[1] - lo[1]) / (hi[0] - lo[0])

    @property
    def first_job_after(self) -> float | None:
        """Seconds from starting the workers until the first success was seen."""
        return next((t for t, n in self.samples if n > 0), None)


def fmt_rate(rate: float | None) -> str:
    return "n/a" if rate is None else f"{rate:,.0f} jobs/s"


# -- the bench ---------------------------------------------------------------------------


class ThroughputBench(Bench):
    """The bench's schema, with the latency table; the producer App; the workers started."""

    def __init__(self, dsn: str, *, poll_interval: float = 0.05) -> None:
        super().__init__(dsn, register, "throughput")
        self.poll_interval = poll_interval
        self.worker_log_lines = 0
        self.released_on_stop = 0

    # -- schema --------------------------------------------------------------------------

    def create(self) -> None:
        super().create()
        self.db.execute(
            f"CREATE TABLE {self.schema}.latency (job_id bigint PRIMARY KEY, "
            "started_at timestamptz NOT NULL)"
        )

    def reset(self) -> None:
        """Empty the tables (no worker may be running)."""
        self.db.execute(f"TRUNCATE {self.schema}.jobs, {self.schema}.latency")

    def fill(self, n: int, batch: int, *, progress: bool = False) -> None:
        """Empty the tables, enqueue n no-op jobs, ANALYZE (as autovacuum would, in time)."""
        self.fill_with("noop", n, batch, progress=progress)

    def fill_with(self, task: str, n: int, batch: int, *, progress: bool = False) -> None:
        """fill() with n jobs of forklift's `task` (no arguments)."""
        self.reset()
        self.enqueue_bulk_of(task, n, batch, progress=progress)
        self.db.execute(f"ANALYZE {self.schema}.jobs")

    def environment(self) -> str:
        """What else shapes the numbers: server settings and competing load."""
        row = self.db.execute(
            "SELECT current_setting('server_version'), current_setting('autovacuum'), "
            "current_setting('synchronous_commit'), "
            "(SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() "
            "AND backend_type = 'client backend' AND state <> 'idle')"
        ).fetchone()
        assert row is not None
        return (
            f"PostgreSQL {row[0]}, autovacuum={row[1]}, synchronous_commit={row[2]}, "
            f"{row[3]} other active sessions at start; {os.cpu_count()} CPUs, "
            f"load average {load_average()} at start"
        )

    def succeeded(self) -> int:
        return int(self.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'"))

    def anomalies(self) -> tuple[int, int]:
        """(jobs that failed or died, jobs that took more than one attempt)."""
        row = self.db.execute(
            f"SELECT count(*) FILTER (WHERE state IN ('dead', 'cancelled') "
            f"OR last_error IS NOT NULL), count(*) FILTER (WHERE attempts > 1) "
            f"FROM {self.schema}.jobs"
        ).fetchone()
        assert row is not None
        return int(row[0]), int(row[1])

    # -- producing -----------------------------------------------------------------------

    def enqueue_one_by_one(self, n: int, task: str = "noop") -> float:
        """Enqueue n jobs with one call each; return the seconds taken."""
        self.app.enqueue(task, {})  # open the producer pool outside the clock
        started = time.perf_counter()
        for _ in range(n):
            self.app.enqueue(task, {})
        return time.perf_counter() - started

    def enqueue_bulk(self, n: int, batch: int, *, progress: bool = False) -> float:
        """Enqueue n no-op jobs with enqueue_many in batches; return the seconds taken."""
        return self.enqueue_bulk_of("noop", n, batch, progress=progress)

    def enqueue_bulk_of(self, task: str, n: int, batch: int, *, progress: bool = False) -> float:
        """Enqueue n jobs of forklift's `task` (no arguments) with enqueue_many in batches;
        return the seconds taken."""
        spent = 0.0
        done = 0
        last_report = time.perf_counter()
        while done < n:
            size = min(batch, n - done)
            specs: list[tuple[str, dict[str, object]]] = [(task, {})] * size
            started = time.perf_counter()
            self.app.enqueue_many(specs)
            spent += time.perf_counter() - started
            done += size
            if progress and (time.perf_counter() - last_report > 2 or done == n):
                last_report = time.perf_counter()
                say(f"  enqueued {done:,}/{n:,} ({done / spent:,.0f} jobs/s)")
        return spent

    # -- workers -------------------------------------------------------------------------

    def start_workers(self, count: int, concurrency: int) -> None:
        for _ in range(count):
            self.start(
                "worker",
                "bench.apps:app",
                "--concurrency",
                str(concurrency),
                "--log-level",
                "WARNING",
            )

    def stop_workers(self, timeout: float = 60.0) -> None:
        """SIGTERM every worker, wait for it (SIGKILL past `timeout`), echo what it logged."""
        for proc in self.procs:
            proc.terminate()
        failed = []
        for proc in self.procs:
            code = proc.stop(timeout)
            lines = proc.output().splitlines()
            # A stop with a backlog gives back what was claimed but not started, one
            # warning per job: expected here, so counted rather than shown.
            released = [line for line in lines if "job.released" in line]
            self.released_on_stop += len(released)
            other = [line for line in lines if "job.released" not in line]
            self.worker_log_lines += len(other)
            for line in other[-20:]:
                say(f"  [worker {proc.pid}] {line}")
            # A worker still booting when the others finished the batch dies of the
            # SIGTERM before its handler is installed: it held nothing, so that is fine.
            booting = code == -signal.SIGTERM and "worker.started" not in proc.output()
            if code != 0 and not booting:
                failed.append(f"worker {proc.pid} exited with {code}")
        self.procs.clear()
        if failed:
            raise RuntimeError("; ".join(failed))

    def stop_all(self) -> None:
        self.stop_workers()

    def check_workers_alive(self) -> None:
        for proc in self.procs:
            proc.check_alive()

    def unfinished(self) -> int:
        """Jobs ready or running, counted on their partial indexes: the progress poll of a
        table that retains many finished jobs, which a count of the succeeded would walk."""
        return int(
            self.scalar(
                "SELECT (SELECT count(*) FROM {s}.jobs WHERE state = 'ready')"
                " + (SELECT count(*) FROM {s}.jobs WHERE state = 'running')"
            )
        )

    def retain(self, n: int, chunk: int = 1_000_000) -> float:
        """Add `n` succeeded jobs, as a day's retention keeps them (one SQL INSERT per
        `chunk`, no notifications), then VACUUM ANALYZE; return the seconds taken."""
        started = time.perf_counter()
        done = 0
        while done < n:
            size = min(chunk, n - done)
            with self.db.transaction():
                self.db.execute("SET LOCAL forklift.quiet = 'on'")  # no NOTIFY per row
                self.db.execute(
                    f"INSERT INTO {self.schema}.jobs (queue, task, args, state, attempts,"
                    " created_at, started_at, completed_at)"
                    " SELECT 'default', 'noop', '{}'::jsonb, 'succeeded', 1,"
                    " now() - make_interval(secs => 86000.0 * g / %s),"
                    " now() - make_interval(secs => 86000.0 * g / %s),"
                    " now() - make_interval(secs => 86000.0 * g / %s)"
                    " FROM generate_series(%s, %s) AS g",
                    (n, n, n, done + 1, done + size),
                )
            done += size
            say(f"  retained {done:,}/{n:,} ({time.perf_counter() - started:.0f}s)")
        self.db.execute(f"VACUUM ANALYZE {self.schema}.jobs")
        return time.perf_counter() - started

    def process(
        self,
        target: int,
        workers: int,
        concurrency: int,
        timeout: float = 600.0,
        *,
        by_unfinished: bool = False,
    ) -> Processing:
        """Start workers, wait until `target` jobs succeeded, stop them; time it. With
        `by_unfinished`, progress is `target` less the jobs still ready or running (the
        table holds only these `target` unfinished ones)."""
        already = 0 if by_unfinished else self.succeeded()
        started = time.perf_counter()
        self.start_workers(workers, concurrency)
        samples: list[tuple[float, int]] = []
        polling = 0.0
        try:
            # Not wait_for: every poll is a progress sample, timed along with the query.
            while True:
                asked = time.perf_counter()
                done = target - self.unfinished() if by_unfinished else self.succeeded() - already
                now = time.perf_counter()
                polling += now - asked
                samples.append((now - started, done))
                if done >= target:
                    break
                if now - started > timeout:
                    raise RuntimeError(f"only {done:,}/{target:,} jobs done after {timeout}s")
                self.check_workers_alive()
                time.sleep(self.poll_interval)
        finally:
            self.stop_workers()
        return Processing(target, workers, concurrency, samples[-1][0], samples, polling)

    # -- latency -------------------------------------------------------------------------

    def wait_listening(self, timeout: float = 20.0) -> None:
        """Wait until a worker's listener has run LISTEN on this schema's channel."""
        listen = f'LISTEN "{self.schema}_jobs"'

        def listening() -> bool:
            self.check_workers_alive()
            return bool(
                self.scalar("SELECT count(*) FROM pg_stat_activity WHERE query = %s", (listen,))
            )

        wait_for(listening, timeout, self.poll_interval, "the worker to LISTEN")

    def wait_latency_rows(self, n: int, timeout: float = 30.0) -> None:
        """Wait until `n` latency jobs have recorded their start."""

        def recorded() -> bool:
            self.check_workers_alive()
            return bool(self.scalar("SELECT count(*) FROM {s}.latency") >= n)

        wait_for(recorded, timeout, self.poll_interval, f"{n} latency jobs to run")

    def latency(self, jobs: int, gap: float, warmup: int = 5) -> list[float]:
        """Enqueue-to-start latencies in ms of `jobs` jobs sent `gap` s apart to one idle worker."""
        self.start_workers(1, 1)
        try:
            self.wait_listening()
            for _ in range(warmup):
                self.app.enqueue("latency", {})
            self.wait_latency_rows(warmup)
            time.sleep(0.2)
            ids = []
            started = time.perf_counter()
            for i in range(jobs):
                ids.append(self.app.enqueue("latency", {}))
                pause = started + (i + 1) * gap - time.perf_counter()
                if pause > 0:
                    time.sleep(pause)
            self.wait_latency_rows(warmup + jobs)
        finally:
            self.stop_workers()
        rows = self.db.execute(
            f"SELECT extract(epoch FROM l.started_at - j.created_at)::float8 * 1000 "
            f"FROM {self.schema}.latency l JOIN {self.schema}.jobs j ON j.id = l.job_id "
            "WHERE j.id = ANY(%s)",
            (ids,),
        ).fetchall()
        return [float(r[0]) for r in rows]


# -- phases ------------------------------------------------------------------------------


def phase_enqueue(bench: ThroughputBench, args: argparse.Namespace, rows: list[Row]) -> None:
    say(f"enqueue: {args.enqueue_one:,} one at a time ...")
    seconds = bench.enqueue_one_by_one(args.enqueue_one)
    rate = args.enqueue_one / seconds
    rows.append(Row("enqueue one-by-one (1 client)", fmt_rate(rate), ">= 1,500", rate >= 1500))
    bench.reset()
    say(f"enqueue: {args.bulk_jobs:,} with enqueue_many, batches of {args.batch:,} ...")
    seconds = bench.enqueue_bulk(args.bulk_jobs, args.batch)
    rate = args.bulk_jobs / seconds
    rows.append(
        Row(f"enqueue_many (batches of {args.batch:,})", fmt_rate(rate), ">= 50,000", rate >= 5e4)
    )
    bench.reset()


def run_processing(
    bench: ThroughputBench, jobs: int, workers: int, concurrency: int, batch: int
) -> Processing:
    bench.fill(jobs, batch)
    say(f"process: {jobs:,} no-op jobs, {workers} workers x concurrency {concurrency} ...")
    result = bench.process(jobs, workers, concurrency)
    bad, repeated = bench.anomalies()
    say(
        f"  {fmt_rate(result.rate)} overall, {fmt_rate(result.steady_rate)} at 10-90%, "
        f"first success after {result.first_job_after or 0:.2f}s, "
        f"progress polls busy {result.poll_load:.0%} of a core; "
        f"failed {bad}, run more than once {repeated}"
    )
    if bad or repeated:
        raise RuntimeError(f"{bad} jobs failed and {repeated} ran more than once")
    return result


def median_run(
    bench: ThroughputBench, args: argparse.Namespace, concurrency: int
) -> tuple[float, float | None]:
    """Median (wall, 10-90%) rates of --rounds processing runs at this concurrency."""
    runs = [
        run_processing(bench, args.jobs, args.workers, concurrency, args.batch)
        for _ in range(args.rounds)
    ]
    steady = [r.steady_rate for r in runs if r.steady_rate is not None]
    return (
        statistics.median(r.rate for r in runs),
        statistics.median(steady) if steady else None,
    )


def phase_processing(bench: ThroughputBench, args: argparse.Namespace, rows: list[Row]) -> int:
    """Run the processing phase (sweeping concurrency first if asked); return the C used."""
    concurrency: int = args.concurrency
    if args.sweep:
        best = 0.0
        for c in args.sweep:
            wall, steady = median_run(bench, args, c)
            rows.append(
                Row(
                    f"  sweep: {args.workers}x{c} (wall / 10-90%)",
                    f"{wall:,.0f} / {fmt_rate(steady)}",
                )
            )
            if wall > best:
                best, concurrency = wall, c
        say(f"sweep: best concurrency {concurrency}")
    wall, steady = median_run(bench, args, concurrency)
    label = f"processing {args.jobs:,} no-ops, {args.workers}x{concurrency}"
    if args.rounds > 1:
        label += f", median of {args.rounds}"
    rows.append(Row(f"{label}: wall", fmt_rate(wall), ">= 10,000", wall >= 1e4))
    rows.append(
        Row(
            f"{label}: 10-90%",
            fmt_rate(steady),
            ">= 10,000",
            None if steady is None else steady >= 1e4,
        )
    )
    bench.reset()
    return concurrency


def phase_latency(bench: ThroughputBench, args: argparse.Namespace, rows: list[Row]) -> None:
    say(f"latency: {args.latency_jobs} jobs {args.latency_gap * 1000:.0f} ms apart, 1 worker ...")
    bench.reset()
    ms = bench.latency(args.latency_jobs, args.latency_gap)
    p50, p99 = percentile(ms, 50), percentile(ms, 99)
    say(f"  p50 {p50:.2f} ms, p99 {p99:.2f} ms, max {max(ms):.2f} ms")
    rows.append(Row("enqueue-to-start latency p50", f"{p50:.2f} ms", "<= 5 ms", p50 <= 5))
    rows.append(Row("enqueue-to-start latency p99", f"{p99:.2f} ms", "<= 50 ms", p99 <= 50))
    bench.reset()


def phase_scale(
    bench: ThroughputBench, args: argparse.Namespace, concurrency: int, rows: list[Row]
) -> None:
    """Rate of the first jobs with a small vs a large backlog (median of a few rounds).

    The small table is refilled before every round; the large one is filled once and
    each round takes the next `--scale-measure` jobs off it, after a VACUUM (this server
    may run without autovacuum, and the small table starts without dead rows too).
    """
    measure = args.scale_measure
    rates: dict[int, list[float]] = {args.scale_small: [], args.scale_large: []}
    for ready in (args.scale_small, args.scale_large):
        for i in range(args.scale_rounds):
            if i == 0 or ready == args.scale_small:
                say(f"scale: enqueueing {ready:,} ready jobs ...")
                bench.fill(ready, args.scale_batch, progress=ready > 100_000)
            else:  # clear the last round's dead rows, as a fresh small table has none
                bench.db.execute(f"VACUUM {bench.schema}.jobs")
            left = ready - (0 if ready == args.scale_small else i * measure)
            say(f"scale: {left:,} ready, processing the first {measure:,} ...")
            result = bench.process(measure, args.workers, concurrency)
            rate = result.steady_rate or result.rate
            say(f"  {fmt_rate(result.rate)} overall, {fmt_rate(result.steady_rate)} at 10-90%")
            rates[ready].append(rate)
            bad, repeated = bench.anomalies()
            if bad or repeated:
                raise RuntimeError(f"{bad} jobs failed and {repeated} ran more than once")
    bench.reset()
    small = statistics.median(rates[args.scale_small])
    large = statistics.median(rates[args.scale_large])
    for ready, rate in ((args.scale_small, small), (args.scale_large, large)):
        rows.append(Row(f"processing {measure:,} with {ready:,} ready, 10-90%", fmt_rate(rate)))
    ratio = large / small
    rows.append(
        Row(
            f"rate with {args.scale_large:,} / with {args.scale_small:,} ready",
            f"{ratio:.2f}",
            ">= 0.80",
            ratio >= 0.8,
        )
    )


def phase_retained(
    bench: ThroughputBench, args: argparse.Namespace, concurrency: int, rows: list[Row]
) -> None:
    """Rate of --scale-measure no-ops with no finished jobs in the table vs with
    --retained succeeded ones kept: a second schema holds those, and the rounds alternate
    between the two (median of --scale-rounds each), so that both see the same machine.
    Progress is polled on the ready and running indexes in both, as a count of the
    succeeded would walk them all."""
    measure = args.scale_measure
    rates: dict[int, list[float]] = {0: [], args.retained: []}
    with ThroughputBench(bench.dsn, poll_interval=bench.poll_interval).session() as kept:
        say(f"retained: adding {args.retained:,} succeeded jobs to {kept.schema} ...")
        kept.retain(args.retained)
        for _ in range(args.scale_rounds):
            for table, retained in ((bench, 0), (kept, args.retained)):
                if retained:  # the last round's dead rows go, as a fresh table has none
                    table.db.execute(f"VACUUM {table.schema}.jobs")
                else:
                    table.reset()
                table.enqueue_bulk(measure, args.batch)
                table.db.execute(f"ANALYZE {table.schema}.jobs")
                say(f"retained: {retained:,} finished, processing {measure:,} ...")
                result = table.process(measure, args.workers, concurrency, by_unfinished=True)
                rate = result.steady_rate or result.rate
                say(f"  {fmt_rate(result.rate)} overall, {fmt_rate(result.steady_rate)} at 10-90%")
                rates[retained].append(rate)
        for table in (bench, kept):
            bad = table.scalar(
                "SELECT count(*) FROM {s}.jobs WHERE state <> 'succeeded' OR attempts <> 1"
                " OR last_error IS NOT NULL"
            )
            if bad:
                raise RuntimeError(f"{bad} jobs failed or ran more than once")
    bench.reset()
    none, full = statistics.median(rates[0]), statistics.median(rates[args.retained])
    rows.append(Row(f"processing {measure:,}, no finished jobs kept, 10-90%", fmt_rate(none)))
    rows.append(
        Row(f"processing {measure:,}, {args.retained:,} finished kept, 10-90%", fmt_rate(full))
    )
    ratio = full / none
    rows.append(
        Row(
            f"rate with {args.retained:,} finished kept / with none",
            f"{ratio:.2f}",
            ">= 0.90",
            ratio >= 0.9,
        )
    )


# -- command line ------------------------------------------------------------------------


def concurrency_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected e.g. 32,64,128") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive numbers, e.g. 32,64,128")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.throughput", __doc__)
    add_processing_args(p)
    add_enqueue_args(p)
    add_latency_args(p)
    add_scale_args(p)
    return p


def add_processing_args(p: argparse.ArgumentParser) -> None:
    """Phase 2: how many jobs, workers and threads, how many runs, how often to poll."""
    p.add_argument(
        "--jobs",
        type=positive,
        default=50_000,
        help="no-op jobs in the processing phase (%(default)s)",
    )
    p.add_argument(
        "--workers", type=positive, default=2, help="worker processes to start (%(default)s)"
    )
    p.add_argument(
        "--concurrency",
        type=positive,
        default=128,
        help="handler threads per worker process (%(default)s: the best of 32/64/128 on a "
        "2-core machine; no-op handlers take no database connection, so this is not a "
        "connection count)",
    )
    p.add_argument(
        "--rounds",
        type=positive,
        default=3,
        help="processing runs per concurrency; the median is reported (%(default)s)",
    )
    p.add_argument(
        "--sweep",
        type=concurrency_list,
        default=None,
        metavar="C1,C2,...",
        help="first run the processing phase at each of these concurrencies and go on with "
        "the fastest (e.g. 32,64,128)",
    )
    p.add_argument(
        "--poll-interval",
        type=positive_float,
        default=0.05,
        help="seconds between progress polls, each a count(*) of the succeeded jobs that "
        "competes with the workers for the server's CPU (%(default)s)",
    )


def add_enqueue_args(p: argparse.ArgumentParser) -> None:
    """Phase 1: jobs enqueued one at a time and in batches (--batch fills the other phases)."""
    p.add_argument(
        "--enqueue-one",
        type=positive,
        default=3_000,
        help="jobs enqueued one call at a time (%(default)s)",
    )
    p.add_argument(
        "--bulk-jobs",
        type=positive,
        default=100_000,
        help="jobs enqueued with enqueue_many (%(default)s)",
    )
    p.add_argument(
        "--batch", type=positive, default=10_000, help="jobs per enqueue_many call (%(default)s)"
    )


def add_latency_args(p: argparse.ArgumentParser) -> None:
    """Phase 3: jobs sent one at a time to an idle worker."""
    p.add_argument(
        "--latency-jobs", type=positive, default=200, help="jobs in the latency phase (%(default)s)"
    )
    p.add_argument(
        "--latency-gap",
        type=positive_float,
        default=0.02,
        help="seconds between latency jobs (%(default)s)",
    )


def add_scale_args(p: argparse.ArgumentParser) -> None:
    """Phase 4: the small and the large table, and what is measured on them."""
    p.add_argument("--skip-scale", action="store_true", help="skip the 10k-vs-1M ready jobs phase")
    p.add_argument(
        "--scale-small", type=positive, default=10_000, help="ready jobs, small table (%(default)s)"
    )
    p.add_argument(
        "--scale-large",
        type=positive,
        default=1_000_000,
        help="ready jobs, large table (%(default)s)",
    )
    p.add_argument(
        "--scale-measure",
        type=positive,
        default=10_000,
        help="jobs processed per measurement in the scale phase (%(default)s; at most "
        "--scale-small)",
    )
    p.add_argument(
        "--scale-rounds",
        type=positive,
        default=3,
        help="measurements per table size in the scale phase, median taken (%(default)s)",
    )
    p.add_argument(
        "--retained",
        type=positive,
        default=None,
        metavar="N",
        help="also measure the rate with N succeeded jobs kept in the table (a day's "
        "retention) against none, e.g. 10000000 (~5 minutes more; off by default)",
    )
    p.add_argument(
        "--scale-batch",
        type=positive,
        default=50_000,
        help="jobs per enqueue_many call when filling the scale tables (%(default)s)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.scale_measure > args.scale_small:
        args.scale_measure = args.scale_small
    rows: list[Row] = []
    began = time.perf_counter()
    with ThroughputBench(args.dsn, poll_interval=args.poll_interval).session() as bench:
        environment = bench.environment()
        say(environment)
        phase_enqueue(bench, args, rows)
        concurrency = phase_processing(bench, args, rows)
        phase_latency(bench, args, rows)
        if not args.skip_scale:
            phase_scale(bench, args, concurrency, rows)
        if args.retained:
            phase_retained(bench, args, concurrency, rows)
    rows.append(Row("peer job queues", "not installed", "-"))
    note = (
        f"forklift bench: {args.workers} workers x concurrency {concurrency}, "
        f"{time.perf_counter() - began:.0f}s in all\n{environment}"
    )
    print_table(rows, note, YES_NO)
    if bench.released_on_stop:
        print(f"jobs released by workers stopped with a backlog: {bench.released_on_stop:,}")
    if bench.worker_log_lines:
        print(f"workers logged {bench.worker_log_lines:,} other warning/error lines (above)")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
