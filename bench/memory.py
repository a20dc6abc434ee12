"""Memory per worker: what does a forked (preloaded) child cost beyond the shared pages?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.memory
    .venv/bin/python -m bench.memory --workers 8 --jobs-per-worker 50

1. Starts `python -m forklift run bench.cpu_app:app --workers 4`; once every child has
   its database connection (pg_stat_activity shows `forklift-worker:<pid>:<nonce>`) it waits
   --settle seconds more, then reads /proc/<pid>/smaps_rollup of the supervisor and of
   each child: RSS, PSS (shared pages split between the processes sharing them) and
   USS = Private_Clean + Private_Dirty (pages no other process maps: what the process
   costs beyond what it shares). Target: USS <= 15 MiB per idle child.
2. Runs --jobs-per-worker short "burn" jobs per child and measures again (copy-on-write
   of touched objects, caches filled by real work).
3. For comparison, one standalone `python -m forklift worker bench.cpu_app:app` (no
   preload, nothing shared by fork), measured the same way, idle and after the same
   number of jobs.

Everything happens in a fresh schema `bench_<random>` that is dropped at the end (also
on error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as `python bench/memory.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    MET,
    Bench,
    ForkliftProcess,
    Row,
    load_average,
    non_negative_float,
    parser,
    positive,
    print_grid,
    print_table,
    say,
)
from bench.cpu_app import register
from forklift.testing import wait_for

TARGET_USS_MIB = 15.0
BURN_ITERATIONS = 100_000  # ~10 ms of CPU per job: enough to exercise the whole job path
MIB = 2**20


# -- memory ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Memory:
    """One process's memory from /proc/<pid>/smaps_rollup, in bytes."""

    role: str
    pid: int
    rss: int
    pss: int
    shared: int  # Shared_Clean + Shared_Dirty
    uss: int  # Private_Clean + Private_Dirty
    threads: int

    @classmethod
    def read(cls, role: str, pid: int) -> Memory:
        fields: dict[str, int] = {}
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()[1:]:
            name, _, rest = line.partition(":")
            parts = rest.split()
            if len(parts) == 2 and parts[1] == "kB":
                fields[name] = int(parts[0]) * 1024
        threads = 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
        return cls(
            role,
            pid,
            fields["Rss"],
            fields["Pss"],
            fields["Shared_Clean"] + fields["Shared_Dirty"],
            fields["Private_Clean"] + fields["Private_Dirty"],
            threads,
        )


def mib(n: float) -> str:
    return f"{n / MIB:.1f} MiB"


def print_processes(title: str, mems: Sequence[Memory]) -> None:
    headers = ("process", "pid", "threads", "RSS", "PSS", "shared", "USS (private)")
    cells = [headers]
    for m in mems:
        cells.append(
            (m.role, str(m.pid), str(m.threads), mib(m.rss), mib(m.pss), mib(m.shared), mib(m.uss))
        )
    print_grid(title, cells, right_align=True)


# -- the bench ---------------------------------------------------------------------------


class MemoryBench(Bench):
    """The schema, the producer App on it, and the forklift processes started."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "memory")

    def wait_connected(
        self, proc: ForkliftProcess, pids: Callable[[], list[int]], n: int, timeout: float = 30.0
    ) -> list[int]:
        """Wait until `n` worker processes run, each holding its pool's first connection."""

        def connected() -> list[int] | None:
            proc.check_alive()
            found = pids()
            if len(found) != n:
                return None
            names = [f"forklift-worker:{p}:%" for p in found]
            row = self.db.execute(
                "SELECT count(DISTINCT application_name) FROM pg_stat_activity "
                "WHERE application_name LIKE ANY(%s)",
                (names,),
            ).fetchone()
            return found if row is not None and row[0] == n else None

        found: list[int] = wait_for(connected, timeout, 0.05, f"{n} connected worker processes")
        return found

    def work(self, proc: ForkliftProcess, jobs: int, timeout: float = 120.0) -> None:
        """Enqueue `jobs` short burn jobs and wait until all have succeeded."""
        self.db.execute(f"TRUNCATE {self.schema}.jobs")
        self.app.enqueue_many([("burn", {"iterations": BURN_ITERATIONS})] * jobs)

        def done() -> bool:
            proc.check_alive()
            row = self.db.execute(
                f"SELECT count(*) FILTER (WHERE state = 'succeeded'), "
                f"count(*) FILTER (WHERE state IN ('dead', 'cancelled')) FROM {self.schema}.jobs"
            ).fetchone()
            assert row is not None
            if row[1]:
                raise RuntimeError(f"{row[1]} burn jobs failed")
            return bool(row[0] >= jobs)

        wait_for(done, timeout, 0.05, f"{jobs} burn jobs to succeed")


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.memory", __doc__)
    p.add_argument(
        "--workers", type=positive, default=4, help="forklift run --workers (%(default)s)"
    )
    p.add_argument(
        "--settle",
        type=non_negative_float,
        default=2.0,
        help="seconds to wait after every worker holds its connection, and after the jobs, "
        "before reading memory (%(default)s)",
    )
    p.add_argument(
        "--jobs-per-worker",
        type=positive,
        default=25,
        help=f"~10 ms burn jobs (spin({BURN_ITERATIONS:,})) per worker process before the "
        "second reading (%(default)s)",
    )
    return p


def measure(
    bench: MemoryBench, args: argparse.Namespace
) -> tuple[list[Memory], list[Memory], list[Memory], list[Memory]]:
    """(prefork idle, prefork after jobs, standalone idle, standalone after jobs)."""
    n = args.workers
    sup = bench.start("run", "bench.cpu_app:app", "--workers", str(n), "--log-level", "WARNING")
    say(f"forklift run --workers {n} (pid {sup.pid}): waiting for {n} connected children ...")
    kids = bench.wait_connected(sup, sup.children, n)
    time.sleep(args.settle)

    def snapshot() -> list[Memory]:
        if sorted(sup.children()) != sorted(kids):
            raise RuntimeError("the supervisor's children changed: one of them died")
        return [Memory.read("supervisor", sup.pid)] + [
            Memory.read(f"child {i + 1}", p) for i, p in enumerate(kids)
        ]

    prefork_idle = snapshot()
    say(f"  {args.jobs_per_worker * n} burn jobs ...")
    bench.work(sup, args.jobs_per_worker * n)
    time.sleep(args.settle)
    prefork_worked = snapshot()
    sup.stop()

    worker = bench.start("worker", "bench.cpu_app:app", "--log-level", "WARNING")
    say(f"forklift worker (pid {worker.pid}): waiting for its connection ...")
    bench.wait_connected(worker, lambda: [worker.pid], 1)
    time.sleep(args.settle)
    single_idle = [Memory.read("standalone worker", worker.pid)]
    say(f"  {args.jobs_per_worker} burn jobs ...")
    bench.work(worker, args.jobs_per_worker)
    time.sleep(args.settle)
    single_worked = [Memory.read("standalone worker", worker.pid)]
    worker.stop()
    return prefork_idle, prefork_worked, single_idle, single_worked


def report(
    args: argparse.Namespace,
    prefork_idle: list[Memory],
    prefork_worked: list[Memory],
    single_idle: list[Memory],
    single_worked: list[Memory],
) -> list[Row]:
    n, jobs = args.workers, args.jobs_per_worker
    target = f"<= {TARGET_USS_MIB:g} MiB"
    rows: list[Row] = []
    for label, mems in (("idle", prefork_idle), (f"after {jobs} jobs each", prefork_worked)):
        parent, kids = mems[0], mems[1:]
        worst = max(k.uss for k in kids)
        rows += [
            Row(
                f"per-child USS, {label} (median / max)",
                f"{mib(statistics.median(k.uss for k in kids))} / {mib(worst)}",
                target,
                worst <= TARGET_USS_MIB * MIB,
            ),
            Row(
                f"  per-child RSS / PSS, {label} (median)",
                f"{mib(statistics.median(k.rss for k in kids))} / "
                f"{mib(statistics.median(k.pss for k in kids))}",
            ),
            Row(
                f"  supervisor RSS / USS, {label}",
                f"{mib(parent.rss)} / {mib(parent.uss)}",
            ),
            Row(
                f"  supervisor + {n} children: total PSS, {label}",
                mib(sum(m.pss for m in mems)),
            ),
        ]
    for label, mems in (("idle", single_idle), (f"after {jobs} jobs", single_worked)):
        m = mems[0]
        rows.append(
            Row(
                f"standalone worker (no fork), {label}: RSS / PSS / USS",
                f"{mib(m.rss)} / {mib(m.pss)} / {mib(m.uss)}",
            )
        )
    prefork_total = sum(m.pss for m in prefork_worked)
    standalone_total = n * single_worked[0].pss
    rows.append(
        Row(
            f"{n} workers after jobs: prefork total PSS vs {n} x standalone PSS",
            f"{mib(prefork_total)} vs {mib(standalone_total)} "
            f"({prefork_total / standalone_total:.0%})",
        )
    )
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    with MemoryBench(args.dsn).session() as bench:
        results = measure(bench, args)
    prefork_idle, prefork_worked, single_idle, single_worked = results
    n = args.workers
    print_processes(f"forklift run --workers {n}, idle ({args.settle:g} s settled)", prefork_idle)
    print_processes(
        f"forklift run --workers {n}, after {args.jobs_per_worker * n} burn jobs", prefork_worked
    )
    print_processes(
        f"forklift worker (standalone), idle, then after {args.jobs_per_worker} burn jobs",
        single_idle + single_worked,
    )
    note = (
        "bench.memory: USS = Private_Clean + Private_Dirty from /proc/<pid>/smaps_rollup, "
        "what a process costs beyond the pages it shares; PSS splits shared pages between "
        f"their sharers; {os.cpu_count()} CPUs, load average {load_average()}"
    )
    print_table(report(args, *results), note, MET)
    bench.print_logged()
    return 0


if __name__ == "__main__":
    sys.exit(main())
