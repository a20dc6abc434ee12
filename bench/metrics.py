"""The supervisor's /metrics, /healthz and /readyz: how fast, and are the counts right?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.metrics
    .venv/bin/python -m bench.metrics --jobs 50000 --scrapes 500

1. In a fresh schema `bench_<random>`, enqueue --jobs no-op jobs spread evenly over the
   50 tasks of bench/metrics_app.py (enqueue_many, in batches), plus, for every task,
   jobs that fail on purpose: 2 that go dead at once (max_attempts=1), 2 that fail once
   and then succeed, 1 that fails twice and goes dead (max_attempts=2). So every task
   has a duration histogram and the outcomes succeeded, failed and dead.
2. Start `python -m forklift run bench.metrics_app:app --workers 16 --concurrency 4
   --metrics-addr 127.0.0.1:0 --log-format json` (the bound address comes from its
   "supervisor.http" log line) and wait until no job is ready or running, scraping
   /metrics now and then meanwhile (scrape times under load: informational).
3. Wait until /metrics has caught up (children report every 0.5 s), then check it
   against the database: the sum of forklift_jobs_total{outcome="succeeded"} equals the
   succeeded jobs, {outcome="dead"} the dead ones, all outcomes together the attempts
   made; the duration and wait histograms count every attempt, the duration histograms
   are well formed, and forklift_queue_depth{state="dead"} (read afresh, > 2 s later)
   equals the dead jobs.
4. Time --scrapes sequential GETs of /metrics with urllib (a new connection each; the
   server speaks HTTP/1.0): p50, p99 and max, response size and series lines. The queue
   gauges are read from the database at most every 2 s, so a scrape after a quiet
   spell of more than 2 s runs a query: warm scrapes are timed in windows of < 1.8 s
   after a priming scrape (which is not counted), cold ones after sleeping 2.1 s.
   The same for /healthz and /readyz (whose database ping is cached 1 s: cold after
   1.1 s).
5. SIGTERM the supervisor; it must exit with code 0, having logged no warning or error
   other than the planned failures. The schema is dropped at the end (also on error,
   Ctrl-C or SIGTERM); the supervisor's log is kept in the temp directory when anything
   went wrong. The exit code is 1 when a target is not met.

The machine may be shared: the supervisor's CPU time per warm scrape is reported next to
the CPU the rest of the machine used meanwhile, to tell a slow server from a busy host.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

if not __package__:  # run as `python bench/metrics.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import forklift
from bench._harness import (
    YES_NO,
    Bench,
    ForkliftProcess,
    Row,
    cpu_seconds,
    load_average,
    machine_busy,
    parser,
    percentile,
    positive,
    print_table,
    say,
)
from bench.metrics_app import TASKS, register
from forklift.testing import WaitTimedOut, wait_for

GAUGE_TTL = 2.0  # forklift.supervisor.ops: queue gauges cached this long
READY_TTL = 1.0  # forklift.supervisor.ops: the /readyz database ping cached this long
TARGET_MS = 50.0
EXPECTED_EVENTS = {"job.dead", "job.failed"}  # the planned failures log these


# -- results -----------------------------------------------------------------------------


@dataclass
class Timings:
    """Wall milliseconds of a series of requests to one endpoint."""

    ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)  # no answer, or not 200

    @property
    def p50(self) -> float:
        return percentile(self.ms, 50)

    @property
    def p99(self) -> float:
        return percentile(self.ms, 99)

    @property
    def max(self) -> float:
        return max(self.ms, default=math.nan)

    def summary(self) -> str:
        return f"p50 {self.p50:.2f} / p99 {self.p99:.2f} / max {self.max:.2f} ms"


@dataclass
class CpuUse:
    """CPU used over a stretch of wall time: by the supervisor, and by everything else."""

    pid: int
    wall: float = 0.0
    supervisor: float = 0.0
    others: float = 0.0  # all other processes except this one (postgres, neighbours, ...)

    @contextlib.contextmanager
    def measure(self) -> Iterator[None]:
        sup, busy, own = cpu_seconds(self.pid), machine_busy(), time.process_time()
        started = time.perf_counter()
        yield
        self.wall = time.perf_counter() - started
        self.supervisor = cpu_seconds(self.pid) - sup
        self.others = max(
            0.0, machine_busy() - busy - self.supervisor - (time.process_time() - own)
        )


# -- the supervisor ----------------------------------------------------------------------


class Supervisor(ForkliftProcess):
    """`python -m forklift run ...` logging JSON lines, and where its HTTP server listens."""

    def events(self) -> list[dict[str, Any]]:
        """The JSON log lines so far (a line that is not JSON becomes {"raw": line})."""
        entries = []
        for line in self.output().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = {"raw": line}
            entries.append(entry if isinstance(entry, dict) else {"raw": line})
        return entries

    def wait_addr(self, timeout: float = 30.0) -> str:
        """HOST:PORT from the "supervisor.http" log line."""

        def logged() -> str | None:
            self.check_alive()
            addrs = [e["addr"] for e in self.events() if e.get("event") == "supervisor.http"]
            return str(addrs[0]) if addrs else None

        addr: str = wait_for(logged, timeout, 0.05, "the supervisor.http log line")
        return addr


# -- scraping ----------------------------------------------------------------------------


def get(url: str, timeout: float = 10.0) -> tuple[int, bytes, float]:
    """(status, body, wall ms) of one GET on a fresh connection; error statuses too."""
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            status, body = int(response.status), response.read()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read()
    return status, body, (time.perf_counter() - started) * 1000


@dataclass
class Scrape:
    """What one /metrics body says, parsed with prometheus_client's own parser."""

    size: int
    series: int  # sample lines (neither comments nor blank)
    jobs: dict[tuple[str, str, str], float]  # (queue, task, outcome) -> forklift_jobs_total
    durations: dict[tuple[str, str], dict[str, Any]]  # (queue, task) -> buckets, count, sum
    wait_count: float
    gauges: dict[str, float]  # "name{labels}" of the gauges

    @classmethod
    def parse(cls, body: bytes) -> Scrape:
        text = body.decode()
        series = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
        jobs: dict[tuple[str, str, str], float] = {}
        durations: dict[tuple[str, str], dict[str, Any]] = {}
        wait_count = 0.0
        gauges: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                labels = s.labels
                if s.name == "forklift_jobs_total":
                    jobs[(labels["queue"], labels["task"], labels["outcome"])] = s.value
                elif family.name == "forklift_job_duration_seconds":
                    d = durations.setdefault(
                        (labels["queue"], labels["task"]), {"buckets": [], "count": 0, "sum": 0}
                    )
                    if s.name.endswith("_bucket"):
                        d["buckets"].append((float(labels["le"]), s.value))
                    elif s.name.endswith("_count"):
                        d["count"] = s.value
                    elif s.name.endswith("_sum"):
                        d["sum"] = s.value
                elif s.name == "forklift_job_wait_seconds_count":
                    wait_count += s.value
                elif family.type == "gauge":
                    key = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
                    gauges[f"{s.name}{{{key}}}"] = s.value
        return cls(len(body), series, jobs, durations, wait_count, gauges)

    def outcome(self, outcome: str) -> int:
        return int(sum(n for (_, _, o), n in self.jobs.items() if o == outcome))

    @property
    def attempts(self) -> int:
        return int(sum(self.jobs.values()))

    def malformed_histograms(self) -> list[str]:
        """Tasks whose buckets are not cumulative or whose +Inf bucket is not the count."""
        bad = []
        for (queue, task), d in sorted(self.durations.items()):
            counts = [n for _, n in sorted(d["buckets"])]
            inf = dict(d["buckets"]).get(math.inf)
            if counts != sorted(counts) or inf != d["count"] or len(counts) < 2:
                bad.append(f"{queue}/{task}")
        return bad


# -- the bench ---------------------------------------------------------------------------


@dataclass
class Expected:
    """What the database says happened."""

    succeeded: int
    dead: int
    attempts: int
    unfinished: int


class MetricsBench(Bench):
    """The schema, the producer App on it, and the supervisor it started."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "metrics")
        self.sup: Supervisor | None = None
        self.scrape_errors: list[str] = []
        self.keep_log = False  # something odd: keep the supervisor's log for a look

    def drop(self) -> None:
        """Drop the schema, stopping the supervisor first; keep its log if anything went wrong."""
        super().drop()
        if self.sup is not None and (self.keep_log or self.scrape_errors):
            kept = Path(tempfile.gettempdir()) / f"forklift-bench-metrics-{self.schema}.log"
            with contextlib.suppress(OSError):
                kept.write_text(self.sup.output())
                say(f"the supervisor's log is kept in {kept}")

    def diagnose(self) -> str:
        """The server's connection count, and whether a fresh connection opens now."""
        started = time.perf_counter()
        try:
            with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
                row = conn.execute(
                    "SELECT count(*), current_setting('max_connections') FROM pg_stat_activity"
                ).fetchone()
        except psycopg.Error as exc:
            return f"a fresh connection failed: {str(exc).strip()[:200]}"
        assert row is not None
        ms = (time.perf_counter() - started) * 1000
        return f"server sessions {row[0]}/{row[1]}, a fresh connection took {ms:.1f} ms"

    def expected(self) -> Expected:
        row = self.db.execute(
            f"SELECT count(*) FILTER (WHERE state = 'succeeded'), "
            f"count(*) FILTER (WHERE state = 'dead'), coalesce(sum(attempts), 0), "
            f"count(*) FILTER (WHERE state NOT IN ('succeeded', 'dead')) "
            f"FROM {self.schema}.jobs"
        ).fetchone()
        assert row is not None
        return Expected(*(int(v) for v in row))

    def enqueue(self, jobs: int, batch: int) -> tuple[int, float]:
        """Enqueue the no-op and the failing jobs; return (how many, seconds taken)."""
        specs: list[forklift.JobSpec] = [
            forklift.JobSpec(TASKS[i % len(TASKS)], {}) for i in range(jobs)
        ]
        for task in TASKS:
            specs += [forklift.JobSpec(task, {"fail": 1}, max_attempts=1)] * 2  # dead
            specs += [forklift.JobSpec(task, {"fail": 1}, max_attempts=2)] * 2  # failed, ok
            specs.append(forklift.JobSpec(task, {"fail": 2}, max_attempts=2))  # failed, dead
        started = time.perf_counter()
        for i in range(0, len(specs), batch):
            self.app.enqueue_many(specs[i : i + batch])
        seconds = time.perf_counter() - started
        self.db.execute(f"ANALYZE {self.schema}.jobs")
        return len(specs), seconds

    def start_supervisor(self, workers: int, concurrency: int) -> str:
        """Start the supervisor; return the base URL of its HTTP server."""
        self.sup = Supervisor(
            [
                "run",
                "bench.metrics_app:app",
                "--workers",
                str(workers),
                "--concurrency",
                str(concurrency),
                "--metrics-addr",
                "127.0.0.1:0",
                "--log-format",
                "json",
            ],
            self.env,
            self.logdir,
        )
        self.procs.append(self.sup)
        addr = self.sup.wait_addr()
        say(f"supervisor pid {self.sup.pid} serves http://{addr}")
        return f"http://{addr}"

    def wait_finished(self, url: str, timeout: float) -> tuple[float, Timings]:
        """Wait until no job is ready or running; scrape every ~0.25 s meanwhile."""
        assert self.sup is not None
        started = time.perf_counter()
        under_load = Timings()
        last_say = started
        # Not wait_for: each round also scrapes /metrics under load (and times it), and
        # the processing time is read off this loop's clock.
        while True:
            left = self.scalar(
                "SELECT count(*) FROM {s}.jobs WHERE state NOT IN ('succeeded', 'dead')"
            )
            now = time.perf_counter()
            if not left:
                return now - started, under_load
            if now - started > timeout:
                raise RuntimeError(f"{left:,} jobs still unfinished after {timeout:g}s")
            if now - last_say > 5:
                last_say = now
                say(f"  {left:,} jobs left after {now - started:.0f}s")
            self.sup.check_alive()
            try:
                status, _, ms = get(f"{url}/metrics")
            except OSError as exc:  # urllib's URLError and connection resets included
                self.scrape_errors.append(
                    f"{now - started:.2f}s into processing: {exc!r}; {self.diagnose()}"
                )
                say(f"  /metrics failed: {exc!r}")
            else:
                if status == 200:
                    under_load.ms.append(ms)
                else:
                    self.scrape_errors.append(
                        f"{now - started:.2f}s into processing: HTTP {status}; {self.diagnose()}"
                    )
            time.sleep(0.25)

    def wait_caught_up(self, url: str, expected: Expected, timeout: float = 15.0) -> float:
        """Seconds until /metrics counts every attempt the database recorded (nan: never)."""

        def caught_up() -> bool:
            status, body, _ = get(f"{url}/metrics")
            return status == 200 and Scrape.parse(body).attempts >= expected.attempts

        started = time.perf_counter()
        try:
            wait_for(caught_up, timeout, 0.1, "/metrics to count every attempt")
        except WaitTimedOut:
            return math.nan
        return time.perf_counter() - started


def timed_get(url: str, timings: Timings, diagnose: Callable[[], str]) -> bytes | None:
    """One GET into `timings`: its time if it answered 200, else why not (and context)."""
    try:
        status, body, ms = get(url)
    except OSError as exc:  # urllib's URLError and connection resets included
        timings.failures.append(f"{exc!r}; {diagnose()}")
        return None
    if status != 200:
        text = body[:200].decode(errors="replace").strip()
        timings.failures.append(f"HTTP {status} {text!r}; {diagnose()}")
        return None
    timings.ms.append(ms)
    return body


def time_warm(url: str, n: int, ttl: float, diagnose: Callable[[], str]) -> tuple[Timings, bytes]:
    """`n` requests, each less than 0.9 x `ttl` after an (untimed) priming one."""
    timings = Timings()
    body = b""
    primed = -math.inf
    while len(timings.ms) + len(timings.failures) < n:
        if time.monotonic() - primed > 0.9 * ttl:
            primed = time.monotonic()
            with contextlib.suppress(OSError):
                get(url)
        body = timed_get(url, timings, diagnose) or body
    return timings, body


def time_cold(url: str, n: int, pause: float, diagnose: Callable[[], str]) -> Timings:
    """`n` requests, each `pause` s after the previous one (past the server's cache)."""
    timings = Timings()
    for _ in range(n):
        time.sleep(pause)
        timed_get(url, timings, diagnose)
    return timings


def equal_row(metric: str, got: int, want: int, what: str) -> Row:
    return Row(metric, f"{got:,}", f"= {want:,} ({what})", got == want)


def timing_rows(label: str, t: Timings, target: float | None) -> list[Row]:
    target_text = f"< {target:g} ms" if target is not None else "-"
    rows = []
    for name, value in (("p50", t.p50), ("p99", t.p99), ("max", t.max)):
        met = None if target is None else value < target
        rows.append(Row(f"{label} {name}", f"{value:.2f} ms", target_text, met))
    failed = len(t.failures)
    rows.append(Row(f"{label}: failed or not 200", str(failed), "0", not failed))
    for failure in t.failures[:5]:
        say(f"  {label}: {failure}")
    return rows


@dataclass
class Processed:
    """What processing every job took, and what the database says happened."""

    total: int  # jobs enqueued, no-op and failing
    seconds: float  # until no job was ready or running
    lag: float  # then until /metrics counted every attempt (nan: it did not in time)
    expected: Expected
    under_load: Timings  # /metrics scraped meanwhile


def run(bench: MetricsBench, args: argparse.Namespace, rows: list[Row]) -> None:
    """The steps of the bench, each adding its rows to `rows`."""
    url, processed = process(bench, args)
    assert bench.sup is not None
    rows += processing_rows(processed)
    scrape = settled_scrape(url)
    rows += counter_rows(scrape, processed.expected)
    rows += histogram_and_gauge_rows(scrape, processed.expected)
    rows += metrics_speed_rows(bench, args, url)
    rows += under_load_rows(bench, processed.under_load)
    rows += health_speed_rows(bench, args, url)
    rows += shutdown_rows(bench.sup)
    bench.keep_log = bench.keep_log or any(r.met is False for r in rows if "ms" not in r.value)


def process(bench: MetricsBench, args: argparse.Namespace) -> tuple[str, Processed]:
    """Enqueue the jobs, start the supervisor, wait for the jobs and for /metrics."""
    say(f"enqueueing {args.jobs:,} no-op jobs and 5 failing jobs per task ...")
    total, seconds = bench.enqueue(args.jobs, args.batch)
    say(f"  {total:,} jobs in {seconds:.2f}s")
    url = bench.start_supervisor(args.workers, args.concurrency)
    say(f"processing with {args.workers} workers x concurrency {args.concurrency} ...")
    processing, under_load = bench.wait_finished(url, args.timeout)
    say(f"  all finished after {processing:.1f}s ({total / processing:,.0f} jobs/s)")
    expected = bench.expected()
    lag = bench.wait_caught_up(url, expected)
    say(f"  /metrics caught up {lag:.2f}s later")
    return url, Processed(total, processing, lag, expected, under_load)


def processing_rows(p: Processed) -> list[Row]:
    return [
        Row("jobs enqueued (no-op + failing)", f"{p.total:,}"),
        Row("processing time (info)", f"{p.seconds:.1f} s ({p.total / p.seconds:,.0f}/s)"),
        Row("/metrics caught up with the database after", f"{p.lag:.2f} s"),
    ]


def settled_scrape(url: str) -> Scrape:
    """One scrape once the counts have settled, with the queue gauges read afresh.

    The gauges are cached GAUGE_TTL, possibly from a scrape just before the last jobs
    finished: this one comes after that.
    """
    time.sleep(GAUGE_TTL + 0.1)
    status, body, _ = get(f"{url}/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics: HTTP {status}")
    return Scrape.parse(body)


def counter_rows(scrape: Scrape, expected: Expected) -> list[Row]:
    """forklift_jobs_total by outcome, and the histograms' counts, against the database."""
    other = {o for (_, _, o) in scrape.jobs} - {"succeeded", "failed", "dead"}
    durations = int(sum(d["count"] for d in scrape.durations.values()))
    return [
        equal_row(
            'sum forklift_jobs_total{outcome="succeeded"}',
            scrape.outcome("succeeded"),
            expected.succeeded,
            "succeeded in db",
        ),
        equal_row(
            'sum forklift_jobs_total{outcome="dead"}',
            scrape.outcome("dead"),
            expected.dead,
            "dead in db",
        ),
        equal_row(
            'sum forklift_jobs_total{outcome="failed"}',
            scrape.outcome("failed"),
            expected.attempts - expected.succeeded - expected.dead,
            "retried attempts",
        ),
        equal_row(
            "sum forklift_jobs_total (all outcomes)", scrape.attempts, expected.attempts, "db"
        ),
        Row("other outcomes seen", ", ".join(sorted(other)) or "none", "none", not other),
        equal_row("sum forklift_job_duration_seconds_count", durations, expected.attempts, "db"),
        equal_row(
            "sum forklift_job_wait_seconds_count", int(scrape.wait_count), expected.attempts, "db"
        ),
    ]


def histogram_and_gauge_rows(scrape: Scrape, expected: Expected) -> list[Row]:
    """Every task's histogram and outcomes present and well formed; the dead-jobs gauge."""
    full = sum(
        1
        for t in TASKS
        if ("default", t) in scrape.durations
        and all(("default", t, o) in scrape.jobs for o in ("succeeded", "failed", "dead"))
    )
    bad = scrape.malformed_histograms()
    dead_gauge = scrape.gauges.get("forklift_queue_depth{queue=default,state=dead}")
    return [
        Row(
            "tasks with a duration histogram and 3 outcomes",
            f"{full}/{len(TASKS)}",
            f"= {len(TASKS)}",
            full == len(TASKS),
        ),
        Row(
            "malformed duration histograms",
            str(len(bad)) + (f" ({bad[0]}...)" if bad else ""),
            "0",
            not bad,
        ),
        Row(
            'forklift_queue_depth{state="dead"}',
            "absent" if dead_gauge is None else f"{dead_gauge:,.0f}",
            f"= {expected.dead:,} (db)",
            dead_gauge == expected.dead,
        ),
    ]


def metrics_speed_rows(bench: MetricsBench, args: argparse.Namespace, url: str) -> list[Row]:
    """Warm scrapes of /metrics (with the supervisor's CPU per scrape), then cold ones."""
    assert bench.sup is not None
    say(f"timing {args.scrapes} warm scrapes of /metrics ...")
    cpu = CpuUse(bench.sup.pid)
    with cpu.measure():
        warm, body = time_warm(f"{url}/metrics", args.scrapes, GAUGE_TTL, bench.diagnose)
    final = Scrape.parse(body)
    rows = [
        Row("/metrics response size", f"{final.size:,} bytes"),
        Row("/metrics series (sample lines)", f"{final.series:,}"),
        *timing_rows(f"/metrics warm, {args.scrapes} sequential", warm, TARGET_MS),
    ]
    # The priming scrapes run too: the supervisor's CPU is spread over all of them.
    scrapes = args.scrapes + math.ceil(cpu.wall / (0.9 * GAUGE_TTL))
    rows.append(
        Row(
            "  supervisor CPU per warm scrape (all threads)",
            f"{cpu.supervisor / scrapes * 1000:.1f} ms",
        )
    )
    rows.append(
        Row("  other processes' CPU meanwhile (noise)", f"{cpu.others / cpu.wall:.2f} cores")
    )
    say(f"  {warm.summary()}")
    say(f"timing {args.cold} cold scrapes of /metrics, {GAUGE_TTL + 0.1:g}s apart ...")
    cold = time_cold(f"{url}/metrics", args.cold, GAUGE_TTL + 0.1, bench.diagnose)
    rows += timing_rows(f"/metrics cold (gauge query), {args.cold}", cold, TARGET_MS)
    say(f"  {cold.summary()}")
    return rows


def under_load_rows(bench: MetricsBench, under_load: Timings) -> list[Row]:
    """The scrapes taken while the jobs ran: failures (a target), times (informational)."""
    rows = [
        Row(
            "/metrics failures while processing",
            str(len(bench.scrape_errors)),
            "0",
            not bench.scrape_errors,
        )
    ]
    for error in bench.scrape_errors[:10]:
        say(f"  scrape failed {error}")
    if under_load.ms:
        rows.append(
            Row(
                f"/metrics while processing ({len(under_load.ms)}), p50 / max",
                f"{under_load.p50:.2f} / {under_load.max:.2f} ms",
            )
        )
    return rows


def health_speed_rows(bench: MetricsBench, args: argparse.Namespace, url: str) -> list[Row]:
    """Warm /healthz and /readyz, then cold /readyz (its database ping not cached)."""
    rows: list[Row] = []
    for path in ("/healthz", "/readyz"):
        warm, _ = time_warm(f"{url}{path}", args.scrapes, READY_TTL, bench.diagnose)
        rows += timing_rows(f"{path} warm, {args.scrapes} sequential", warm, TARGET_MS)
        say(f"  {path}: {warm.summary()}")
    cold = time_cold(f"{url}/readyz", args.cold, READY_TTL + 0.1, bench.diagnose)
    rows += timing_rows(f"/readyz cold (db ping), {args.cold}", cold, TARGET_MS)
    say(f"  /readyz cold: {cold.summary()}")
    return rows


def shutdown_rows(sup: Supervisor) -> list[Row]:
    """SIGTERM the supervisor: its exit code, and the warnings it logged unexpectedly."""
    say("SIGTERM to the supervisor ...")
    started = time.perf_counter()
    code = sup.stop()
    rows = [
        Row(
            "supervisor exit code after SIGTERM",
            f"{code} (in {time.perf_counter() - started:.1f} s)",
            "0",
            code == 0,
        )
    ]
    problems = [
        e
        for e in sup.events()
        if ("raw" in e or e.get("level") in ("warning", "error", "critical"))
        and e.get("event") not in EXPECTED_EVENTS
    ]
    rows.append(Row("unexpected warning/error log lines", str(len(problems)), "0", not problems))
    for e in problems[:20]:
        say(f"  [forklift] {json.dumps(e)[:300]}")
    return rows


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.metrics", __doc__)
    p.add_argument(
        "--jobs", type=positive, default=20_000, help="no-op jobs to enqueue (%(default)s)"
    )
    p.add_argument(
        "--batch", type=positive, default=5_000, help="jobs per enqueue_many call (%(default)s)"
    )
    p.add_argument(
        "--workers",
        type=positive,
        default=16,
        help="worker processes; each opens a few connections (%(default)s)",
    )
    p.add_argument(
        "--concurrency", type=positive, default=4, help="handler threads per worker (%(default)s)"
    )
    p.add_argument(
        "--scrapes",
        type=positive,
        default=200,
        help="sequential warm requests timed per endpoint (%(default)s)",
    )
    p.add_argument(
        "--cold",
        type=positive,
        default=5,
        help="cold requests timed for /metrics and /readyz, each after a pause (%(default)s)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        help="seconds to wait for every job to finish (%(default)s)",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rows: list[Row] = []
    began = time.perf_counter()
    load = load_average()
    with MetricsBench(args.dsn).session() as bench:
        try:
            run(bench, args, rows)
        except BaseException:
            bench.keep_log = True
            raise
    note = (
        f"forklift metrics bench: {args.workers} workers x concurrency {args.concurrency}, "
        f"{time.perf_counter() - began:.0f}s in all; {os.cpu_count()} CPUs, "
        f"load average {load} at start"
    )
    print_table(rows, note, YES_NO)
    failed = [r.metric for r in rows if r.met is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
