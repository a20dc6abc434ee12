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
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import psycopg
from prometheus_client.parser import text_string_to_metric_families

import forklift
from forklift._db import redact

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/test"
REPO_ROOT = Path(__file__).resolve().parent.parent
GAUGE_TTL = 2.0  # forklift.supervisor.ops: queue gauges cached this long
READY_TTL = 1.0  # forklift.supervisor.ops: the /readyz database ping cached this long
TARGET_MS = 50.0
EXPECTED_EVENTS = {"job.dead", "job.failed"}  # the planned failures log these
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# -- results -----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the final table."""

    metric: str
    value: str
    target: str = "-"
    met: bool | None = None  # None: informational

    @property
    def verdict(self) -> str:
        return "-" if self.met is None else ("yes" if self.met else "NO")


def print_table(rows: Sequence[Row], note: str) -> None:
    headers = ("metric", "value", "target", "met")
    cells = [headers, *((r.metric, r.value, r.target, r.verdict) for r in rows)]
    widths = [max(len(c[i]) for c in cells) for i in range(4)]
    line = "  ".join("-" * w for w in widths)
    print()
    print(note)
    print(line)
    for i, c in enumerate(cells):
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip())
        if i == 0:
            print(line)
    print(line)
    sys.stdout.flush()


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


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


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` (all its threads) has used so far (0 once gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return (int(fields[11]) + int(fields[12])) / _CLOCK_TICKS  # fields 14, 15: utime, stime


def machine_busy() -> float:
    """CPU seconds all processes on the machine have used since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / _CLOCK_TICKS


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


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the cleanup in `finally` blocks runs."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


# -- the supervisor ----------------------------------------------------------------------


class Supervisor:
    """`python -m forklift run ...` in its own session, its JSON log lines in a file."""

    def __init__(self, args: Sequence[str], env: dict[str, str], logdir: Path) -> None:
        self.log_path = logdir / "supervisor.log"
        with self.log_path.open("wb") as log:  # the child keeps its own descriptor
            self.popen = subprocess.Popen(
                [sys.executable, "-m", "forklift", *args],
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # a Ctrl-C of the bench reaches the bench only
            )
        self.pid = self.popen.pid
        self.returncode: int | None = None

    def output(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

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

    def check_alive(self) -> None:
        if self.popen.poll() is not None:
            raise RuntimeError(
                f"forklift (pid {self.pid}) exited with {self.popen.returncode}:\n"
                + self.output()[-3000:]
            )

    def wait_addr(self, timeout: float = 30.0) -> str:
        """HOST:PORT from the "supervisor.http" log line."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for entry in self.events():
                if entry.get("event") == "supervisor.http":
                    return str(entry["addr"])
            self.check_alive()
            time.sleep(0.05)
        raise RuntimeError(f"no supervisor.http log line within {timeout:g}s")

    def children(self) -> list[int]:
        try:
            text = Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text()
        except OSError:
            return []
        return [int(p) for p in text.split()]

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait; past `timeout`, SIGKILL its children and it. Return the code."""
        if self.returncode is not None:
            return self.returncode
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                say(f"forklift (pid {self.pid}) still running {timeout:g}s after SIGTERM; killing")
                for pid in self.children():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                self.popen.kill()
                self.popen.wait(timeout=10)
        self.returncode = self.popen.returncode
        return self.returncode


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


class Bench:
    """The schema, the producer App on it, and the supervisor it started."""

    def __init__(self, dsn: str, schema: str) -> None:
        from bench.metrics_app import register  # importable once main() put REPO_ROOT on path

        self.dsn = dsn
        self.schema = schema
        self.app = register(forklift.App(dsn, schema=schema))
        self.db: psycopg.Connection[Any] | None = None
        self.sup: Supervisor | None = None
        self.scrape_errors: list[str] = []
        self.keep_log = False  # something odd: keep the supervisor's log for a look
        self.logdir = Path(tempfile.mkdtemp(prefix="forklift-bench-metrics-"))
        self.env = dict(os.environ)
        self.env.update(
            FORKLIFT_DATABASE_URL=dsn,
            FORKLIFT_SCHEMA=schema,
            PYTHONPATH=os.pathsep.join(
                p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p
            ),
        )

    def create(self) -> None:
        self.app.migrate()
        self.db = psycopg.connect(self.dsn, autocommit=True)

    def drop(self) -> None:
        """Stop the supervisor if still running and drop the schema, whatever happened."""
        if self.sup is not None:
            try:
                self.sup.stop()
            except Exception as exc:  # the schema goes in any case
                say(f"while stopping forklift (pid {self.sup.pid}): {exc}")
        self.app.close()
        if self.db is not None:
            self.db.close()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '30s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        if self.sup is not None and (self.keep_log or self.scrape_errors):
            kept = Path(tempfile.gettempdir()) / f"forklift-bench-metrics-{self.schema}.log"
            with contextlib.suppress(OSError):
                shutil.copyfile(self.sup.log_path, kept)
                say(f"the supervisor's log is kept in {kept}")
        shutil.rmtree(self.logdir, ignore_errors=True)

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        assert self.db is not None
        row = self.db.execute(sql.format(s=self.schema), params).fetchone()
        return None if row is None else row[0]

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
        assert self.db is not None
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
        from bench.metrics_app import TASKS

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
        assert self.db is not None
        self.db.execute(f"ANALYZE {self.schema}.jobs")
        return len(specs), seconds

    def start(self, workers: int, concurrency: int) -> str:
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
        addr = self.sup.wait_addr()
        say(f"supervisor pid {self.sup.pid} serves http://{addr}")
        return f"http://{addr}"

    def wait_finished(self, url: str, timeout: float) -> tuple[float, Timings]:
        """Wait until no job is ready or running; scrape every ~0.25 s meanwhile."""
        assert self.sup is not None
        started = time.perf_counter()
        under_load = Timings()
        last_say = started
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
        """Seconds until /metrics counts every attempt the database recorded."""
        started = time.perf_counter()
        while True:
            status, body, _ = get(f"{url}/metrics")
            if status == 200 and Scrape.parse(body).attempts >= expected.attempts:
                return time.perf_counter() - started
            if time.perf_counter() - started > timeout:
                return math.nan
            time.sleep(0.1)


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


def run(bench: Bench, args: argparse.Namespace, rows: list[Row]) -> None:
    say(f"enqueueing {args.jobs:,} no-op jobs and 5 failing jobs per task ...")
    total, seconds = bench.enqueue(args.jobs, args.batch)
    say(f"  {total:,} jobs in {seconds:.2f}s")
    url = bench.start(args.workers, args.concurrency)
    assert bench.sup is not None
    say(f"processing with {args.workers} workers x concurrency {args.concurrency} ...")
    processing, under_load = bench.wait_finished(url, args.timeout)
    say(f"  all finished after {processing:.1f}s ({total / processing:,.0f} jobs/s)")
    expected = bench.expected()
    lag = bench.wait_caught_up(url, expected)
    say(f"  /metrics caught up {lag:.2f}s later")

    # Correctness, on one scrape taken once the counts have settled and the queue gauges
    # (cached GAUGE_TTL, possibly from a scrape just before the last jobs finished) are
    # read afresh.
    time.sleep(GAUGE_TTL + 0.1)
    status, body, _ = get(f"{url}/metrics")
    if status != 200:
        raise RuntimeError(f"/metrics: HTTP {status}")
    scrape = Scrape.parse(body)
    rows.append(Row("jobs enqueued (no-op + failing)", f"{total:,}"))
    rows.append(Row("processing time (info)", f"{processing:.1f} s ({total / processing:,.0f}/s)"))
    rows.append(Row("/metrics caught up with the database after", f"{lag:.2f} s"))
    rows.append(
        equal_row(
            'sum forklift_jobs_total{outcome="succeeded"}',
            scrape.outcome("succeeded"),
            expected.succeeded,
            "succeeded in db",
        )
    )
    rows.append(
        equal_row(
            'sum forklift_jobs_total{outcome="dead"}',
            scrape.outcome("dead"),
            expected.dead,
            "dead in db",
        )
    )
    rows.append(
        equal_row(
            'sum forklift_jobs_total{outcome="failed"}',
            scrape.outcome("failed"),
            expected.attempts - expected.succeeded - expected.dead,
            "retried attempts",
        )
    )
    rows.append(
        equal_row(
            "sum forklift_jobs_total (all outcomes)", scrape.attempts, expected.attempts, "db"
        )
    )
    other = {o for (_, _, o) in scrape.jobs} - {"succeeded", "failed", "dead"}
    rows.append(Row("other outcomes seen", ", ".join(sorted(other)) or "none", "none", not other))
    durations = int(sum(d["count"] for d in scrape.durations.values()))
    rows.append(
        equal_row("sum forklift_job_duration_seconds_count", durations, expected.attempts, "db")
    )
    rows.append(
        equal_row(
            "sum forklift_job_wait_seconds_count", int(scrape.wait_count), expected.attempts, "db"
        )
    )
    from bench.metrics_app import TASKS

    full = sum(
        1
        for t in TASKS
        if ("default", t) in scrape.durations
        and all(("default", t, o) in scrape.jobs for o in ("succeeded", "failed", "dead"))
    )
    rows.append(
        Row(
            "tasks with a duration histogram and 3 outcomes",
            f"{full}/{len(TASKS)}",
            f"= {len(TASKS)}",
            full == len(TASKS),
        )
    )
    bad = scrape.malformed_histograms()
    rows.append(
        Row(
            "malformed duration histograms",
            str(len(bad)) + (f" ({bad[0]}...)" if bad else ""),
            "0",
            not bad,
        )
    )
    dead_gauge = scrape.gauges.get("forklift_queue_depth{queue=default,state=dead}")
    rows.append(
        Row(
            'forklift_queue_depth{state="dead"}',
            "absent" if dead_gauge is None else f"{dead_gauge:,.0f}",
            f"= {expected.dead:,} (db)",
            dead_gauge == expected.dead,
        )
    )

    # speed
    say(f"timing {args.scrapes} warm scrapes of /metrics ...")
    cpu = CpuUse(bench.sup.pid)
    with cpu.measure():
        warm, body = time_warm(f"{url}/metrics", args.scrapes, GAUGE_TTL, bench.diagnose)
    final = Scrape.parse(body)
    rows.append(Row("/metrics response size", f"{final.size:,} bytes"))
    rows.append(Row("/metrics series (sample lines)", f"{final.series:,}"))
    rows += timing_rows(f"/metrics warm, {args.scrapes} sequential", warm, TARGET_MS)
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
    rows.append(
        Row(
            "/metrics failures while processing",
            str(len(bench.scrape_errors)),
            "0",
            not bench.scrape_errors,
        )
    )
    for error in bench.scrape_errors[:10]:
        say(f"  scrape failed {error}")
    if under_load.ms:
        rows.append(
            Row(
                f"/metrics while processing ({len(under_load.ms)}), p50 / max",
                f"{under_load.p50:.2f} / {under_load.max:.2f} ms",
            )
        )
    for path in ("/healthz", "/readyz"):
        warm, _ = time_warm(f"{url}{path}", args.scrapes, READY_TTL, bench.diagnose)
        rows += timing_rows(f"{path} warm, {args.scrapes} sequential", warm, TARGET_MS)
        say(f"  {path}: {warm.summary()}")
    cold = time_cold(f"{url}/readyz", args.cold, READY_TTL + 0.1, bench.diagnose)
    rows += timing_rows(f"/readyz cold (db ping), {args.cold}", cold, TARGET_MS)
    say(f"  /readyz cold: {cold.summary()}")

    say("SIGTERM to the supervisor ...")
    started = time.perf_counter()
    code = bench.sup.stop()
    rows.append(
        Row(
            "supervisor exit code after SIGTERM",
            f"{code} (in {time.perf_counter() - started:.1f} s)",
            "0",
            code == 0,
        )
    )
    problems = [
        e
        for e in bench.sup.events()
        if ("raw" in e or e.get("level") in ("warning", "error", "critical"))
        and e.get("event") not in EXPECTED_EVENTS
    ]
    rows.append(Row("unexpected warning/error log lines", str(len(problems)), "0", not problems))
    for e in problems[:20]:
        say(f"  [forklift] {json.dumps(e)[:300]}")
    bench.keep_log = bench.keep_log or any(r.met is False for r in rows if "ms" not in r.value)


# -- command line ------------------------------------------------------------------------


def positive(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m bench.metrics",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("FORKLIFT_DATABASE_URL") or DEFAULT_DSN,
        help="PostgreSQL URL (default: FORKLIFT_DATABASE_URL, else %(default)s)",
    )
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
    if str(REPO_ROOT) not in sys.path:  # run as `python bench/metrics.py`
        sys.path.insert(0, str(REPO_ROOT))
    schema = f"bench_{secrets.token_hex(4)}"
    rows: list[Row] = []
    began = time.perf_counter()
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    with sigterm_exits():
        bench = Bench(args.dsn, schema)
        try:
            say(f"schema {schema} on {redact(args.dsn)}")
            bench.create()
            run(bench, args, rows)
        except BaseException:
            bench.keep_log = True
            raise
        finally:
            bench.drop()
            say(f"dropped schema {schema}")
    note = (
        f"forklift metrics bench: {args.workers} workers x concurrency {args.concurrency}, "
        f"{time.perf_counter() - began:.0f}s in all; {os.cpu_count()} CPUs, "
        f"load average {load} at start"
    )
    print_table(rows, note)
    failed = [r.metric for r in rows if r.met is False]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
