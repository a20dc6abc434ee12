"""What limits cost and how exact they are: forklift's claims under a Limit against the same
jobs unlimited, with pgqueuer's own limits beside them, in one table.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.limits                      # everything, ~5 minutes
    .venv/bin/python -m bench.limits --seconds 20 --rounds 1   # a shorter run
    .venv/bin/python -m bench.limits --no-peers           # forklift only

Every measurement runs in a fresh database `bench_limits_<hex>` (forklift in a fresh
schema in it), dropped at the end with every process it started, also on error, Ctrl-C
or SIGTERM. forklift runs as `forklift run bench.limits_app:APP --workers 2` at its
default settings (concurrency 1 per worker, adaptive prefetch); its task "tick" is a
no-op. A drain is timed as bench.throughput's are: from the workers' spawn until a count
of succeeded jobs, polled every 50 ms, reaches N; the rate between 10 % and 90 % done
(boot and tail left out) is the one compared. Each drain runs --rounds times, the
variants in turn (the order rotated each round); the table gives the medians.

1. overhead  N no-ops (--jobs, 20,000) with no limit vs under Limit(concurrency=10_000)
             on the task (never binding with 2 workers), and vs a queue-wide concurrency
             of 10,000 (a row of the limits table, scope 'queue'): the limited drain over
             the unlimited one, target >= 0.90.
2. per key   N no-ops spread over 100 values of `k` (job i has k = i % 100) under
             Limit(concurrency=1, key="k") vs the same jobs unlimited: target >= 0.50.
             No-op handlers, the hardest case for a per-key limit: a key's slot is held
             from its claim until the completion is written, with no handler time to
             hide that in. Checked too: no key ever ran two jobs at once.
3. rate      Limit(rate=500, per=1.0) with --rate-jobs (40,000) ready up front (the same
             workers start ~10,000/s unlimited), for --seconds (60) from the first start:
             starts/s over the run, as the count over --seconds and as the mean count of
             a 1 s window over every position in the run (the long-run rate, burst or
             not: the design admits 100/101 of the rate, ~495/s), and the most starts in
             any 1 s (and 0.1 s) sliding window; all from the jobs' started_at (the claim
             time, set by the limited claim), with their deviation from 500: target
             within 2 %, and no 1 s window above 500.
4. pgqueuer  (the peers venv of bench.compare, .venv-peers, made on first use) 2 worker
             processes at its defaults (batch size 10). Its @entrypoint takes
             concurrency_limit (enforced in its dequeue, across workers) and, in 1.6, no
             per-key and no rate limit (the installed version's parameters are read and
             shown). Per key is stood in for by 100 entrypoints k0..k99 with
             concurrency_limit=1 (the jobs go to them in turn) vs the same 100 with none.

The table goes to stdout, progress to stderr; the numbers also to --json
(bench/results/limits.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/limits.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _peers_env, limits_app
from bench._contenders import WORKERS
from bench._harness import (
    REPO_ROOT,
    fresh_database,
    load_average,
    non_negative_float,
    parser,
    positive,
    positive_float,
    print_grid,
    say,
    sigterm_exits,
    wait_quiet,
)
from bench._peers import Pgqueuer
from bench.throughput import Processing, ThroughputBench
from forklift.testing import wait_for

KEYS = 100  # key values of the per-key scenario
BATCH = 10_000  # jobs per enqueue_many
QUEUE_LIMIT = 10_000  # the queue-wide concurrency of the overhead scenario
QUIET_CORES = 0.3  # what the rest of the machine may use before a drain starts
RESULTS = REPO_ROOT / "bench" / "results" / "limits.json"
QUIET = ("--log-level", "WARNING")
FORKLIFT_NOTE = (
    "forklift: `forklift run bench.limits_app:APP --workers 2` (defaults: concurrency 1, "
    "adaptive prefetch); task tick, a no-op; starts = jobs.started_at, the claim time"
)


# -- forklift --------------------------------------------------------------------------


class LimitsBench(ThroughputBench):
    """A fresh schema whose workers are `forklift run bench.limits_app:APP --workers 2`."""

    def __init__(self, dsn: str, app_name: str) -> None:
        super().__init__(dsn)
        limits_app.register(self.app, limits_app.LIMITS[app_name])
        self.app_name = app_name

    def start_workers(self, count: int, concurrency: int) -> None:
        """One supervisor of `count` workers at the default concurrency (the argument is
        ThroughputBench's and unused)."""
        self.start("run", f"bench.limits_app:{self.app_name}", "--workers", str(count), *QUIET)

    def fill_ticks(self, n: int, keys: int) -> None:
        """Empty the tables, enqueue n "tick" jobs with k = i % keys, ANALYZE."""
        self.reset()
        for done in range(0, n, BATCH):
            size = min(BATCH, n - done)
            self.app.enqueue_many([("tick", {"k": (done + i) % keys}) for i in range(size)])
        self.db.execute(f"ANALYZE {self.schema}.jobs")

    def limit_queue(self, concurrency: int) -> None:
        """A queue-wide limit on "default", as `forklift queues limit` writes it."""
        self.db.execute(
            f"INSERT INTO {self.schema}.limits (scope, name, concurrency) "
            "VALUES ('queue', 'default', %s)",
            (concurrency,),
        )

    def check_outcomes(self) -> None:
        failed, retried = self.anomalies()
        if failed or retried:
            raise RuntimeError(f"{failed} job(s) failed and {retried} ran more than once")

    def key_overlaps(self) -> int:
        """Jobs that started before the one before them of the same key had finished."""
        return int(
            self.scalar(
                "SELECT count(*) FROM (SELECT started_at, lag(completed_at) OVER "
                "(PARTITION BY limit_key ORDER BY started_at) AS before FROM {s}.jobs) AS o "
                "WHERE started_at < before"
            )
        )

    def first_start(self) -> datetime | None:
        self.check_workers_alive()
        found: datetime | None = self.scalar("SELECT min(started_at) FROM {s}.jobs")
        return found

    def clock_past(self, at: datetime, seconds: float) -> bool:
        self.check_workers_alive()
        return bool(
            self.scalar("SELECT clock_timestamp() >= %s + make_interval(secs => %s)", (at, seconds))
        )

    def starts_within(self, first: datetime, seconds: float) -> list[float]:
        """The started_at of the jobs started in [first, first + seconds), as seconds after
        `first`, in order."""
        rows = self.db.execute(
            f"SELECT extract(epoch FROM started_at - %(t)s)::float8 FROM {self.schema}.jobs "
            "WHERE started_at >= %(t)s AND started_at < %(t)s + make_interval(secs => %(s)s) "
            "ORDER BY started_at",
            {"t": first, "s": seconds},
        ).fetchall()
        return [float(r[0]) for r in rows]


@dataclass
class Drained:
    """One drain and what was checked after it."""

    run: Processing
    overlaps: int = 0  # per key: jobs that ran beside another of their key


def forklift_drain(
    dsn: str, app_name: str, jobs: int, *, keys: int = 1, queue_limit: int | None = None
) -> Drained:
    with fresh_database(dsn, "bench_limits") as db, LimitsBench(db, app_name).session() as bench:
        bench.fill_ticks(jobs, keys)
        if queue_limit is not None:
            bench.limit_queue(queue_limit)
        run = bench.process(jobs, WORKERS, 1)
        bench.check_outcomes()
        return Drained(run, bench.key_overlaps() if keys > 1 else 0)


# -- the rate ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RateRun:
    """Starts under the rate limit over `seconds` from the first."""

    seconds: float
    starts: list[float]  # seconds after the first start, in order
    backlog: int  # ready jobs left when the run was read: the supply never ran dry if > 0

    @property
    def rate(self) -> float:
        return len(self.starts) / self.seconds

    @property
    def mean_in_a_second(self) -> float:
        """The mean count of a 1 s window over every position in the run: the long-run
        rate whether the starts come evenly or in bursts (unlike count / seconds, which
        counts one burst more or less depending on where the run's end falls)."""
        span = self.seconds - 1.0
        covered = sum(max(0.0, min(t, span) - max(t - 1.0, 0.0)) for t in self.starts)
        return covered / span

    @property
    def most_in_a_second(self) -> int:
        return most_within(self.starts, 1.0)


def most_within(times: Sequence[float], width: float) -> int:
    """The most of the (sorted) `times` in any half-open window of `width`."""
    best = lo = 0
    for hi, t in enumerate(times):
        while times[lo] <= t - width:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def forklift_rate(dsn: str, jobs: int, seconds: float) -> RateRun:
    with fresh_database(dsn, "bench_limits") as db, LimitsBench(db, "rated").session() as bench:
        bench.fill_ticks(jobs, 1)
        bench.start_workers(WORKERS, 1)
        try:
            first: datetime = wait_for(bench.first_start, 60, 0.05, "the first start")
            # Half a second more: a claim whose clock was read by the end commits after it.
            wait_for(
                lambda: bench.clock_past(first, seconds + 0.5),
                seconds + 30,
                0.1,
                f"{seconds:g} s of starts",
            )
            starts = bench.starts_within(first, seconds)
            backlog = int(bench.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'ready'"))
        finally:
            bench.stop_workers()
        return RateRun(seconds, starts, backlog)


# -- pgqueuer ----------------------------------------------------------------------------


class KeyedPgqueuer(Pgqueuer):
    """pgqueuer with the entrypoints k0..k99, each with `concurrency_limit` (0: none)."""

    def __init__(self, dsn: str, python: Path, concurrency_limit: int) -> None:
        super().__init__(dsn, python, best=10)
        keyed = ("--keys", str(KEYS), "--key-limit", str(concurrency_limit))
        self.setting = self.make_setting("keys", WORKERS, *self.worker(*keyed))

    def fill_keys(self, n: int) -> None:
        self.reset()
        self.cli("enqueue-keys", "k", n, KEYS, "--batch", BATCH)
        self.enqueued = n
        self.analyze()


def pgqueuer_drain(dsn: str, python: Path, jobs: int, concurrency_limit: int) -> Drained:
    with (
        fresh_database(dsn, "bench_limits") as db,
        KeyedPgqueuer(db, python, concurrency_limit).session() as peer,
    ):
        peer.fill_keys(jobs)
        return Drained(peer.process(jobs, WORKERS, 0))


def pgqueuer_entrypoint_options(python: Path) -> list[str]:
    """The keyword parameters of the installed pgqueuer's PgQueuer.entrypoint."""
    code = (
        "import inspect, json; from pgqueuer import PgQueuer; "
        "print(json.dumps(list(inspect.signature(PgQueuer.entrypoint).parameters)[2:]))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    found: list[str] = json.loads(out.stdout)
    return found


# -- rounds ------------------------------------------------------------------------------


@dataclass
class Variant:
    """One drain, measured once a round."""

    label: str
    measure: Callable[[], Drained]
    runs: list[Drained] = field(default_factory=list)

    def rate(self) -> float | None:
        """The median 10-90 % rate (None: no run had one)."""
        known = [d.run.steady_rate for d in self.runs if d.run.steady_rate is not None]
        return statistics.median(known) if known else None

    def cell(self) -> str:
        if not self.runs:
            return "-"
        rate = self.rate()
        seconds = statistics.median(d.run.seconds for d in self.runs)
        return f"{'n/a' if rate is None else f'{rate:,.0f}'} jobs/s ({seconds:.1f} s)"

    def to_json(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "rate_10_90": [d.run.steady_rate for d in self.runs],
            "seconds": [d.run.seconds for d in self.runs],
            "key_overlaps": [d.overlaps for d in self.runs],
        }


def run_rounds(variants: Sequence[Variant], rounds: int, quiet_wait: float) -> None:
    """Each variant once a round, their order rotated by one each round, each after up
    to `quiet_wait` s of waiting for the rest of the machine to calm down."""
    for r in range(rounds):
        turn = r % len(variants)
        for v in [*variants[turn:], *variants[:turn]]:
            say(f"round {r + 1}/{rounds}: {v.label} ...")
            wait_quiet(QUIET_CORES, quiet_wait)
            v.runs.append(v.measure())
            rate = v.runs[-1].run.steady_rate
            say(f"    {'n/a' if rate is None else f'{rate:,.0f}'} jobs/s (10-90 %)")


def ratio(limited: Variant, plain: Variant) -> float | None:
    a, b = limited.rate(), plain.rate()
    return None if a is None or b is None or b == 0 else a / b


def fmt_ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


# -- the table ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Line:
    """One row of the table: forklift's value, pgqueuer's beside it, the target."""

    scenario: str
    metric: str
    forklift: str
    peer: str = "-"
    target: str = "-"
    met: bool | None = None  # None: no target

    def cells(self) -> list[str]:
        verdict = "-" if self.met is None else ("yes" if self.met else "NO")
        return [self.scenario, self.metric, self.forklift, self.peer, self.target, verdict]


def overhead_lines(plain: Variant, task: Variant, queue: Variant) -> list[Line]:
    lines = [Line("1 overhead", "no limit", plain.cell())]
    limited = [
        (f"task Limit(concurrency={QUEUE_LIMIT:_})", task),
        (f"queue limit concurrency {QUEUE_LIMIT:,}", queue),
    ]
    for label, v in limited:
        r = ratio(v, plain)
        lines.append(Line("", label, v.cell()))
        lines.append(
            Line("", "  / no limit", fmt_ratio(r), "", ">= 0.90x", r is not None and r >= 0.9)
        )
    return lines


def per_key_lines(fk: tuple[Variant, Variant], pq: tuple[Variant, Variant] | None) -> list[Line]:
    plain, keyed = fk
    r = ratio(keyed, plain)
    peer = (
        ("-", "-", "-")
        if pq is None
        else (pq[0].cell(), pq[1].cell(), fmt_ratio(ratio(pq[1], pq[0])))
    )
    overlaps = sum(d.overlaps for d in keyed.runs)
    return [
        Line(f"2 per key ({KEYS} keys, no-op)", "no limit", plain.cell(), peer[0]),
        Line("", "concurrency 1 per key", keyed.cell(), peer[1]),
        Line("", "  / no limit", fmt_ratio(r), peer[2], ">= 0.50x", r is not None and r >= 0.5),
        Line("", "  jobs started beside their key's", f"{overlaps}", "-", "0", overlaps == 0),
    ]


def rate_lines(run: RateRun, peer: str) -> list[Line]:
    rate = limits_app.RATE
    off, mean, most = run.rate / rate - 1, run.mean_in_a_second, run.most_in_a_second
    return [
        Line(f"3 rate {rate}/1s", f"starts in {run.seconds:g} s / {run.seconds:g}",
             f"{run.rate:,.1f}", peer, f"{rate} +- 2 %", abs(off) <= 0.02),
        Line("", "  deviation from 500", f"{off:+.2%}", "", "within 2 %", abs(off) <= 0.02),
        Line("", "mean starts in a 1 s window", f"{mean:,.1f}", "",
             f"~{rate * 100 / 101:.0f} (100/101)"),
        Line("", "  deviation from 500", f"{mean / rate - 1:+.2%}", "", "within 2 %",
             abs(mean / rate - 1) <= 0.02),
        Line("", "most starts in any 1 s window", f"{most:,}", "", f"<= {rate}", most <= rate),
        Line("", "  deviation from 500", f"{most / rate - 1:+.2%}", "", "within 2 %",
             abs(most / rate - 1) <= 0.02),
        Line("", "most starts in any 0.1 s window", f"{most_within(run.starts, 0.1):,}", "", "-"),
        Line("", "ready jobs left at the end", f"{run.backlog:,}", "", "> 0 (never ran dry)",
             run.backlog > 0),
    ]  # fmt: skip


def print_lines(lines: Sequence[Line], peer: str, environment: str, notes: Sequence[str]) -> None:
    header = ["scenario", "metric", "forklift", peer, "target", "met"]
    print_grid(f"bench.limits: {environment}", [header, *(line.cells() for line in lines)])
    for note in notes:
        print(note)
    sys.stdout.flush()


# -- the run -----------------------------------------------------------------------------


@dataclass
class Peer:
    """pgqueuer, when asked for: its venv's python, its version, what it offers."""

    python: Path
    version: str
    options: list[str]  # the keyword parameters of its @entrypoint

    def rate_cell(self) -> str:
        """The rate row's pgqueuer cell."""
        return "offered, not run" if "requests_per_second" in self.options else "not offered"

    def note(self) -> str:
        return (
            f"pgqueuer {self.version}: its @entrypoint takes {', '.join(self.options)}; per key "
            f"is {KEYS} entrypoints k0..k{KEYS - 1}, each with concurrency_limit=1 (or none)"
        )


def find_peer(args: argparse.Namespace) -> Peer | None:
    if args.no_peers:
        return None
    python = _peers_env.ensure()
    version = _peers_env.versions(python)["pgqueuer"]
    return Peer(python, version, pgqueuer_entrypoint_options(python))


def measure(args: argparse.Namespace, peer: Peer | None) -> tuple[list[Line], dict[str, Any]]:
    dsn, jobs = args.dsn, args.jobs
    plain = Variant("no limit", lambda: forklift_drain(dsn, "unlimited", jobs))
    task = Variant("task limit", lambda: forklift_drain(dsn, "roomy", jobs))
    queue = Variant(
        "queue limit", lambda: forklift_drain(dsn, "unlimited", jobs, queue_limit=QUEUE_LIMIT)
    )
    run_rounds([plain, task, queue], args.rounds, args.quiet_wait)
    keyed_plain = Variant(
        "100 keys, no limit", lambda: forklift_drain(dsn, "unlimited", jobs, keys=KEYS)
    )
    keyed = Variant("100 keys, 1 each", lambda: forklift_drain(dsn, "per_key", jobs, keys=KEYS))
    variants = [keyed_plain, keyed]
    pq: tuple[Variant, Variant] | None = None
    if peer is not None:
        python = peer.python
        pq = (
            Variant(
                "pgqueuer 100 entrypoints, no limit", lambda: pgqueuer_drain(dsn, python, jobs, 0)
            ),
            Variant(
                "pgqueuer 100 entrypoints, limit 1", lambda: pgqueuer_drain(dsn, python, jobs, 1)
            ),
        )
        variants += pq
    run_rounds(variants, args.rounds, args.quiet_wait)
    say(f"rate: {args.rate_jobs:,} jobs ready, {args.seconds:g} s of starts ...")
    rate = forklift_rate(dsn, args.rate_jobs, args.seconds)
    lines = [
        *overhead_lines(plain, task, queue),
        *per_key_lines((keyed_plain, keyed), pq),
        *rate_lines(rate, "-" if peer is None else peer.rate_cell()),
    ]
    raw = {
        "drains": [v.to_json() for v in [plain, task, queue, *variants]],
        "rate": {"seconds": rate.seconds, "starts": len(rate.starts), "backlog": rate.backlog},
    }
    return lines, raw


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.limits", __doc__)
    p.add_argument("--jobs", type=positive, default=20_000, help="jobs per drain (20000)")
    p.add_argument("--rounds", type=positive, default=3, help="rounds of every drain (3)")
    p.add_argument(
        "--seconds", type=positive_float, default=60.0, help="length of the rate run (60)"
    )
    p.add_argument(
        "--rate-jobs", type=positive, default=40_000, help="jobs ready for the rate run (40000)"
    )
    p.add_argument(
        "--quiet-wait",
        type=non_negative_float,
        default=20.0,
        help="seconds to wait before each drain for other processes to use < 0.3 cores (20)",
    )
    p.add_argument("--no-peers", action="store_true", help="forklift only, no pgqueuer")
    p.add_argument("--json", type=Path, default=RESULTS, help="results file (%(default)s)")
    return p


def write_json(path: Path, lines: Sequence[Line], environment: str, raw: dict[str, Any]) -> None:
    keys = ("scenario", "metric", "forklift", "pgqueuer", "target", "met")
    rows = [dict(zip(keys, line.cells(), strict=True)) for line in lines]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"environment": environment, "rows": rows, "raw": raw}, indent=2))
    say(f"wrote {path}")


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if args.seconds < 5:
        p.error("--seconds must be at least 5")
    enough = limits_app.RATE * (args.seconds + 5)
    if args.rate_jobs < enough:
        p.error(f"--rate-jobs must be at least {enough:,.0f}: the rate run must not run dry")
    load = load_average()
    peer = find_peer(args)
    began = time.perf_counter()
    with sigterm_exits():
        lines, raw = measure(args, peer)
    environment = (
        f"{args.rounds} round(s) of {args.jobs:,}-job drains, medians of the 10-90 % rate "
        f"(wall s from spawn); {time.perf_counter() - began:.0f} s; {os.cpu_count()} CPUs, "
        f"load average {load} at start, {load_average()} at end"
    )
    notes = [FORKLIFT_NOTE] if peer is None else [FORKLIFT_NOTE, peer.note()]
    peer_name = "pgqueuer (not run)" if peer is None else f"pgqueuer {peer.version}"
    print_lines(lines, peer_name, environment, notes)
    write_json(args.json, lines, environment, raw)
    return 0 if all(line.met is not False for line in lines) else 1


if __name__ == "__main__":
    sys.exit(main())
