"""Steady state: a constant offered load for --minutes; does forklift stay as fast and small?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.steady                       # 5,000 jobs/s for 10 minutes
    .venv/bin/python -m bench.steady --embedded            # the same on an embedded server
    .venv/bin/python -m bench.steady --minutes 2 --rate 500

It starts `forklift run bench.compare_app:app --workers 2` at its defaults, with only
retention shortened (--retain-finished, 60 s) so that pruning really runs, in a fresh
schema. A producer offers --rate jobs a second, in batches every 10 ms (enqueue_many,
as a fleet of producers would), each job carrying the producer's time.time() just before
its enqueue call; the handler's first act stamps its own time.time() (bench/_stamps.py),
so latency = handler start - enqueue, one clock. Per minute it prints: jobs offered and
started, p50 / p99 latency of the jobs enqueued in that minute, the jobs table's size
(with its indexes and TOAST), its live and dead tuples (pg_stat_user_tables) and the
vacuums run on it so far, by forklift's maintenance (manual) and by autovacuum.

The targets: latency in the last minute within 1.5x (p50) and 2.5x (p99)
the second's (the first minute is the workers' warm-up and the table's first fill); the
table bounded: its size in the last minute at most 1.5x its size at the end of the
minute after the retention window first filled, and the most dead tuples of the last
three minutes at most 1.5x the most of the three from that minute (later growth is
bloat).
The machine's PostgreSQL may run with autovacuum = off (this one does): forklift's
maintenance vacuums the hot table itself, so both kinds of server are worth a run.
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import math
import os
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as `python bench/steady.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _stamps, apps
from bench._harness import (
    Bench,
    Row,
    load_average,
    parser,
    percentile,
    positive,
    positive_float,
    print_grid,
    print_table,
    say,
)
from bench.compare_app import register_stamp
from forklift import App
from forklift.embedded import EmbeddedPostgres

TICK = 0.01  # the producer sends a batch every 10 ms


@dataclass
class Minute:
    """What one minute of the run looked like."""

    offered: int = 0
    started: int = 0
    p50_ms: float = math.nan
    p99_ms: float = math.nan
    table_mb: float = 0.0
    live: int = 0
    dead: int = 0
    vacuums: int = 0
    autovacuums: int = 0


class StampReader:
    """The stamps file read on from where it was last read (it grows to millions of lines)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._rest = b""

    def new(self) -> list[_stamps.Stamp]:
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._rest + data).split(b"\n")
        self._rest = lines.pop()  # an unfinished last line waits for the next read
        out = []
        for line in lines:
            key, pid, enqueued, started = line.decode().split()
            out.append(_stamps.Stamp(key, int(pid), float(enqueued), float(started)))
        return out


class SteadyBench(Bench):
    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, lambda app: register_stamp(apps.register(app)), "steady")
        self.stamps = Path(self.logdir) / "stamps"
        self.env[_stamps.ENV] = str(self.stamps)

    def table_stats(self) -> tuple[float, int, int, int, int]:
        """Size (MB, with indexes and TOAST), live and dead tuples, vacuums, autovacuums."""
        row = self.db.execute(
            "SELECT pg_total_relation_size(relid), n_live_tup, n_dead_tup,"
            " vacuum_count, autovacuum_count FROM pg_stat_user_tables"
            " WHERE schemaname = %s AND relname = 'jobs'",
            (self.schema,),
        ).fetchone()
        assert row is not None
        size, live, dead, vacuums, autovacuums = row
        return size / 2**20, int(live), int(dead), int(vacuums), int(autovacuums)


def produce(app: App, rate: float, seconds: float, first_key: int) -> Iterator[int]:
    """Offer `rate` jobs a second for `seconds`; yields the jobs sent after each batch."""
    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1 - sent
        if due > 0:
            t = time.time()
            batch = [("stamp", {"key": str(first_key + sent + i), "t": t}) for i in range(due)]
            app.enqueue_many(batch)
            sent += due
            yield sent
        pause = start + (sent / rate) - time.monotonic()
        time.sleep(max(pause, 0.0) or TICK / 10)


def run(bench: SteadyBench, args: argparse.Namespace) -> list[Minute]:
    bench.start(
        "run",
        "bench.compare_app:app",
        "--workers",
        "2",
        "--retain-finished",
        f"{args.retain}s",
        "--log-level",
        "WARNING",
    )
    reader = StampReader(bench.stamps)
    minutes: list[Minute] = []
    by_minute: dict[int, list[float]] = {}
    ends: list[int] = []  # the first key of the next minute, per minute

    def collect() -> None:
        for s in reader.new():  # the minute a job belongs to is the one that sent it
            by_minute.setdefault(bisect.bisect_right(ends, int(s.key)), []).append(s.latency_ms)

    for m in range(args.minutes):
        minute = Minute()
        first_key = ends[-1] if ends else 0
        for sent in produce(bench.app, args.rate, 60.0, first_key):
            minute.offered = sent
        ends.append(first_key + minute.offered)
        collect()
        (
            minute.table_mb,
            minute.live,
            minute.dead,
            minute.vacuums,
            minute.autovacuums,
        ) = bench.table_stats()
        minutes.append(minute)
        say(
            f"minute {m + 1}: offered {minute.offered}, started {len(by_minute.get(m, []))},"
            f" table {minute.table_mb:.1f} MB, dead tuples {minute.dead}"
        )
    deadline = time.monotonic() + 30  # the last minute's jobs: let them start
    while time.monotonic() < deadline and sum(map(len, by_minute.values())) < ends[-1]:
        collect()
        time.sleep(0.2)
    for m, minute in enumerate(minutes):
        latencies = by_minute.get(m, [])
        minute.started = len(latencies)
        if latencies:
            minute.p50_ms = percentile(latencies, 50)
            minute.p99_ms = percentile(latencies, 99)
    bench.print_logged()
    return minutes


def print_minutes(minutes: Sequence[Minute], args: argparse.Namespace, server: str) -> None:
    """One row per minute."""
    header = ("minute", "offered", "started", "p50 ms", "p99 ms", "table MB", "live", "dead")
    cells = [(*header, "vacuums (forklift / auto)")]
    for i, m in enumerate(minutes, 1):
        cells.append(
            (
                str(i),
                f"{m.offered:,}",
                f"{m.started:,}",
                f"{m.p50_ms:.2f}",
                f"{m.p99_ms:.2f}",
                f"{m.table_mb:.1f}",
                f"{m.live:,}",
                f"{m.dead:,}",
                f"{m.vacuums} / {m.autovacuums}",
            )
        )
    title = f"steady {args.rate:,.0f} jobs/s for {len(minutes)} min, retention {args.retain:g} s"
    print_grid(f"{title}, {server}", cells, right_align=True)


def report(minutes: Sequence[Minute], args: argparse.Namespace, server: str) -> None:
    """The minutes, then the targets: the last minute against the second (latency) and
    against the one after the retention window first filled (size, dead tuples)."""
    print_minutes(minutes, args, server)
    second, last = minutes[min(1, len(minutes) - 1)], minutes[-1]
    at = min(len(minutes) - 1, math.ceil(args.retain / 60))
    settled = minutes[at]
    # Dead tuples rise and fall as the hot table's vacuums catch up (a sawtooth of one
    # vacuum every ~15 s at 5,000 jobs/s): flat means the peaks do not grow, so compare
    # the most of the last three minutes with the most of the three from `settled`.
    peak_then = max(m.dead for m in minutes[at : at + 3])
    peak_now = max(m.dead for m in minutes[max(at, len(minutes) - 3) :])
    offered, started = sum(m.offered for m in minutes), sum(m.started for m in minutes)

    def within(metric: str, now: float, then: float, unit: str, times: float = 1.5) -> Row:
        return Row(metric, f"{now:,.2f} / {then:,.2f}{unit}", f"<= {times:g}x", now <= times * then)

    rows = [
        within("p50 latency, last minute / second", last.p50_ms, second.p50_ms, " ms"),
        within("p99 latency, last minute / second", last.p99_ms, second.p99_ms, " ms", 2.5),
        within("jobs table, last minute / settled", last.table_mb, settled.table_mb, " MB"),
        Row(
            "dead tuples, most of the last 3 minutes / of 3 settled",
            f"{peak_now:,} / {peak_then:,}",
            "<= 1.5x (or < 10,000)",
            peak_now <= max(1.5 * peak_then, 10_000),
        ),
        Row("started / offered", f"{started:,} / {offered:,}", "all", started >= offered),
    ]
    print_table(rows, f"load average at the end: {load_average()}")


@contextlib.contextmanager
def server(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """The DSN to run on and how to name it: --dsn, or an embedded server."""
    if not args.embedded:
        yield args.dsn, "the server at --dsn"
        return
    with EmbeddedPostgres(prefix="forklift-steady-") as pg:
        yield pg.dsn, "embedded PostgreSQL (autovacuum at PostgreSQL's defaults)"


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.steady", __doc__)
    p.add_argument("--rate", type=positive_float, default=5000.0, help="jobs/s offered (5000)")
    p.add_argument("--minutes", type=positive, default=10, help="minutes to run (10)")
    p.add_argument(
        "--retain",
        type=positive_float,
        default=60.0,
        help="seconds finished jobs are kept (forklift run --retain-finished; 60)",
    )
    p.add_argument(
        "--embedded", action="store_true", help="run on an embedded PostgreSQL, not --dsn"
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with server(args) as (dsn, name):
        with SteadyBench(dsn).session() as bench:
            setting = bench.scalar("SELECT current_setting('autovacuum')")
            say(f"{name}: autovacuum = {setting}; pid {os.getpid()}")
            minutes = run(bench, args)
        report(minutes, args, f"{name}, autovacuum = {setting}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
