"""CPU-bound jobs and start-up: does `forklift run --workers 2` keep up with a bare Pool?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.cpu
    .venv/bin/python -m bench.cpu --cases 200x50 --rounds 5
    .venv/bin/python -m bench.cpu --baseline /tmp/forklift-main   # before -> after

Two cases by default, in one run: 200 jobs of 50 ms and 40 jobs of 500 ms (--cases).
For each:

1. Calibrate `spin(iterations)` of bench/cpu_app.py so one call takes the case's time
   in this process. The single-call duration d is the median of a few calls, measured
   again just before and just after every timed run (each ratio uses the mean of the
   two: on a shared or virtual machine the speed of a core drifts from minute to minute).
2. Enqueue the CPU jobs ("burn") in bulk, start
   `python -m forklift run bench.cpu_app:app --workers 2 --log-level WARNING` and time
   from its spawn (interpreter boot included) to the last job's completion, read from
   the database (`max(completed_at)`: no polling interval in the clock, and the
   supervisor's shutdown outside it; the bench looks every 0.2 s only, a query each time
   the workers need both cores); the database runs on this machine, so its clock is
   this one's. Also read there: spawn -> the first claim (`min(started_at)`); the
   tail: how many jobs each worker ran (each job returns its pid) and how far apart the
   two workers' last completions are (one idles meanwhile); and from the times each job
   returns (its spin's start and end), a handler's time in the workers against d, and
   the gaps between a worker's jobs (one handler's end -> the next one's start: the
   worker's own cost per job).
3. The reference: multiprocessing.Pool(2).map of the same calls, with no queue, no
   database and no boot in the clock (started and warmed first). forklift / Pool is
   forklift's own cost; targets: <= 1.05 for 200 x 50 ms, <= 1.02 for 40 x 500 ms, on
   the walls of each round (the runs seconds apart, each round in another order);
   each wall normalised by its own d is shown too.
4. Optionally (--single, --asyncio): `forklift run --workers 1`, and a single-process
   asyncio runner that runs every job's CPU work on its event loop (~2x the 2-core ideal).

Start-up, also in each round:

- `import forklift.cli` in a fresh interpreter, against `python -c pass`: the median
  wall time of several (target: <= 0.12 s above the bare interpreter);
- spawn -> first claim split into its parts: `forklift run` started through
  bench/_boot_probe.py, which marks when each step begins or ends (interpreter up,
  imports, app import, the pooler check's connection, the first fork, the child's boot,
  its first connection, its first claim). Target: <= 0.15 s in all.

With --baseline DIR (a directory holding another version's `forklift` package, e.g.
`git archive main forklift | tar -x -C /tmp/forklift-main`), every forklift measurement
is made for that version too, interleaved with this one's: before -> after in one run.

Each mode runs --rounds times (interleaved, the order rotated each round); medians are
reported. Before each
measurement the bench waits (up to --quiet-wait s) for the rest of the machine to go
quiet, and it reports the cores forklift and every other process used during each run
(from /proc), so a number spoilt by a neighbour can be told from a slow forklift.

Everything happens in a fresh schema `bench_<random>` that is dropped at the end (also
on error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import functools
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as `python bench/cpu.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    MET,
    REPO_ROOT,
    Bench,
    Command,
    ForkliftProcess,
    Row,
    cpu_seconds,
    load_average,
    machine_busy,
    parser,
    positive,
    positive_float,
    print_table,
    say,
    wait_quiet,
)
from bench.cpu_app import register, spin, timed_spin
from forklift.testing import wait_for

# How often the bench looks whether the jobs are done. Not part of the measurement (the
# database's timestamps are), and seldom: each look costs the machine a query while the
# workers need both cores.
POLL_INTERVAL = 0.2
TARGET_RATIO = 1.15  # wall / the computed ideal (informational next to the Pool's)
# forklift / Pool, by the jobs' duration in ms (other durations: the nearest one's)
POOL_TARGETS = {50.0: 1.05, 500.0: 1.02}
IMPORT_TARGET = 0.12  # s, `import forklift.cli` above `python -c pass`
FIRST_CLAIM_TARGET = 0.15  # s, spawn -> first claim
PROBE = REPO_ROOT / "bench" / "_boot_probe.py"


@dataclass(frozen=True)
class Case:
    """`jobs` CPU jobs of `ms` milliseconds each."""

    jobs: int
    ms: float

    @property
    def name(self) -> str:
        return f"{self.jobs} x {self.ms:g} ms"

    @property
    def target(self) -> float:
        """forklift / Pool at most."""
        return POOL_TARGETS[min(POOL_TARGETS, key=lambda ms: abs(ms - self.ms))]


def case_list(text: str) -> list[Case]:
    """argparse type: "200x50,40x500" (jobs x milliseconds, comma-separated)."""
    cases = []
    for part in text.split(","):
        jobs, sep, ms = part.strip().partition("x")
        try:
            case = Case(int(jobs), float(ms))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} is not JOBSxMS, e.g. 200x50") from None
        if not sep or case.jobs < 1 or case.ms <= 0:
            raise argparse.ArgumentTypeError(f"{part!r} is not JOBSxMS, e.g. 200x50")
        cases.append(case)
    return cases


# -- one version of forklift ----------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    """Which forklift a process runs: this checkout's, or --baseline's package."""

    label: str
    path: Path  # the directory holding the `forklift` package

    def env(self, base: dict[str, str]) -> dict[str, str]:
        """`base` with this tree's package first on the path (bench.* from the repo)."""
        paths = [str(self.path), str(REPO_ROOT), base.get("PYTHONPATH", "")]
        return {**base, "PYTHONPATH": os.pathsep.join(dict.fromkeys(p for p in paths if p))}

    def argv(self, *args: str) -> list[str]:
        """The interpreter, told not to put the current directory first (-P): the
        package found is this tree's."""
        return [sys.executable, "-P", *args]


HERE = Tree("this", REPO_ROOT)


# -- the bench ---------------------------------------------------------------------------


@dataclass
class Run:
    """One timed run of `jobs` CPU jobs."""

    seconds: float
    first_success: float | None = None  # seconds from spawn to the first completion
    handler: float | None = None  # mean seconds of a spin in the workers (the handler)
    gap: float | None = None  # median seconds from a worker's handler end to its next start
    gaps: float = 0.0  # those seconds, summed over all the workers
    own_cpu: float = 0.0  # CPU seconds of the processes measured (supervisor + children)
    other_cpu: float = 0.0  # CPU seconds every other process on the machine used meanwhile
    # d: one call's median wall seconds in this process, measured just before and just
    # after the run (the machine's speed drifts); the ideal uses their mean.
    d_before: float = 0.0
    d_after: float = 0.0
    attempts: int = 1  # runs it took to get one undisturbed (or the least disturbed)
    first_claim: float | None = None  # seconds from spawn to the first claim
    polled: float | None = None  # seconds from spawn until the bench saw the last success
    per_worker: list[int] = field(default_factory=list)  # jobs each worker ran, most first
    spread: float | None = None  # seconds between the workers' last completions

    @property
    def d(self) -> float:
        return (self.d_before + self.d_after) / 2

    def ratio(self, jobs: int, cores: int) -> float:
        """Wall time over the ideal `jobs` x d / `cores`."""
        return self.seconds / (jobs * self.d / cores)

    @property
    def cores_used(self) -> float:
        return self.own_cpu / self.seconds

    @property
    def cores_taken(self) -> float:
        """Cores others kept busy on average (postgres serving forklift included)."""
        return max(0.0, self.other_cpu) / self.seconds


class CpuBench(Bench):
    """The schema, the producer App on it, and the forklift processes started."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "cpu")

    def spawn(self, tree: Tree, *args: str) -> ForkliftProcess:
        """`python -m forklift ARGS` of `tree` (this checkout's: as Bench.start does)."""
        if tree is HERE:
            return self.start(*args)
        proc = Command(tree.argv("-m", "forklift", *args), tree.env(self.env), self.logdir)
        self.procs.append(proc)
        return proc

    def fill(self, jobs: int, iterations: int) -> None:
        self.db.execute(f"TRUNCATE {self.schema}.jobs")
        self.app.enqueue_many([("burn", {"iterations": iterations})] * jobs)
        self.db.execute(f"ANALYZE {self.schema}.jobs")

    def run_forklift(self, jobs: int, iterations: int, workers: int, tree: Tree = HERE) -> Run:
        """Enqueue `jobs` burn jobs, time `forklift run --workers N` through them."""
        self.fill(jobs, iterations)
        busy_before = machine_busy()
        spawned = time.time()
        started = time.perf_counter()
        proc = self.spawn(
            tree, "run", "bench.cpu_app:app", "--workers", str(workers), "--log-level", "WARNING"
        )
        try:
            while True:
                done = self.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")
                now = time.perf_counter() - started
                if done >= jobs:
                    break
                if now > 600:
                    raise RuntimeError(f"only {done}/{jobs} jobs done after 600 s")
                proc.check_alive()
                time.sleep(POLL_INTERVAL)
            # Read before SIGTERM: an exited child's CPU time is gone from /proc.
            own_cpu = sum(cpu_seconds(p) for p in [proc.pid, *proc.children()])
            other_cpu = machine_busy() - busy_before - own_cpu
        finally:
            proc.stop()
        bad = self.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE state <> 'succeeded' OR attempts <> 1"
        )
        if bad:
            raise RuntimeError(f"{bad} jobs did not succeed at the first attempt")
        row = self.db.execute(
            f"""SELECT extract(epoch FROM max(completed_at))::float8,
                       extract(epoch FROM min(started_at))::float8,
                       extract(epoch FROM min(completed_at))::float8
                FROM {self.schema}.jobs"""
        ).fetchone()
        assert row is not None
        last, first_claim, first = row
        run = Run(last - spawned, first - spawned, own_cpu=own_cpu, other_cpu=other_cpu)
        run.first_claim = first_claim - spawned
        run.polled = now
        self.read_workers(run)
        return run

    def read_workers(self, run: Run) -> None:
        """Into `run`, from the jobs' results: the jobs each worker ran, how far apart
        the workers' last completions are, a handler's mean time, and the gaps between
        a worker's jobs."""
        # The pid, and when the handler's spin began and ended (a --baseline tree's own
        # bench/cpu_app.py may return the pid alone: then no gaps).
        spins = self.db.execute(
            f"""SELECT coalesce(result->'pid', result)::bigint,
                       extract(epoch FROM completed_at)::float8,
                       (result->>'began')::float8, (result->>'ended')::float8
                FROM {self.schema}.jobs"""
        ).fetchall()
        by_pid: dict[int, list[tuple[float, float | None, float | None]]] = {}
        for pid, completed, began, ended in spins:
            by_pid.setdefault(pid, []).append((completed, began, ended))
        ends = sorted(((len(j), max(c for c, _, _ in j)) for j in by_pid.values()), reverse=True)
        run.per_worker = [n for n, _ in ends]
        run.spread = max(t for _, t in ends) - min(t for _, t in ends)
        timed = [
            sorted((b, e) for _, b, e in jobs if b is not None and e is not None)
            for jobs in by_pid.values()
        ]
        if all(timed):
            gaps = [t[i + 1][0] - t[i][1] for t in timed for i in range(len(t) - 1)]
            run.handler = statistics.mean(e - b for t in timed for b, e in t)
            run.gap = statistics.median(gaps) if gaps else None
            run.gaps = sum(gaps)

    def boot(self, tree: Tree, workers: int) -> dict[str, float]:
        """Spawn -> first claim of `forklift run --workers N`, split (bench/_boot_probe.py):
        each mark's seconds after the spawn; the child's are the first claimer's."""
        self.fill(workers * 4, 1_000)
        marks = self.logdir / f"marks-{time.monotonic_ns()}"
        argv = tree.argv(str(PROBE), str(marks), "run", "bench.cpu_app:app")
        argv += ["--workers", str(workers), "--log-level", "WARNING"]
        spawned = time.time()
        proc = Command(argv, tree.env(self.env), self.logdir)
        self.procs.append(proc)

        def claimed() -> bool:
            proc.check_alive()
            return marks.exists() and " first_claim " in marks.read_text()

        try:
            wait_for(claimed, 60, 0.01, "the first claim")
        finally:
            proc.stop()
        by_pid: dict[int, dict[str, float]] = {}
        for line in marks.read_text().splitlines():
            pid, label, at = line.split()
            by_pid.setdefault(int(pid), {}).setdefault(label, float(at) - spawned)
        parent = by_pid.pop(proc.pid)
        child = min(
            (m for m in by_pid.values() if "first_claim" in m), key=lambda m: m["first_claim"]
        )
        return {**parent, **child}


def import_seconds(tree: Tree, code: str, env: dict[str, str]) -> float:
    """Wall seconds of a fresh interpreter running `code` (start and exit included)."""
    started = time.perf_counter()
    subprocess.run(tree.argv("-c", code), env=tree.env(env), cwd="/", check=True)
    return time.perf_counter() - started


def time_spin(iterations: int) -> float:
    """Wall seconds of one `spin(iterations)` call in this process."""
    started = time.perf_counter()
    spin(iterations)
    return time.perf_counter() - started


def single_call(iterations: int, samples: int) -> float:
    """Median wall seconds of `samples` calls: the single-call duration d."""
    return statistics.median(time_spin(iterations) for _ in range(samples))


def calibrate(target: float, samples: int) -> int:
    """Iterations for one `spin` call of ~`target` seconds of wall time here."""
    iterations = 10_000
    while (elapsed := time_spin(iterations)) < 0.01:
        iterations *= 2
    for _ in range(2):  # scale, then refine on the median of a few calls
        iterations = max(1, round(iterations * target / elapsed))
        elapsed = single_call(iterations, samples)
    return iterations


def run_pool(jobs: int, iterations: int, processes: int) -> Run:
    """The parallel reference: multiprocessing.Pool.map of the same calls, no queue at all.

    The pool is started and warmed before the clock runs (spawned interpreters, so
    nothing of this process's threads and connections is forked).
    """
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(spin, [1_000] * processes * 8, chunksize=1)  # every process up and importing
        pids = [c.pid for c in multiprocessing.active_children() if c.pid is not None]
        cpu_before = sum(cpu_seconds(pid) for pid in pids)
        busy_before = machine_busy()
        started = time.perf_counter()
        spins = pool.map(timed_spin, [iterations] * jobs, chunksize=1)
        seconds = time.perf_counter() - started
        used = sum(cpu_seconds(pid) for pid in pids) - cpu_before
        other = machine_busy() - busy_before - used
    handler = statistics.mean(ended - began for began, ended in spins)
    return Run(seconds, handler=handler, own_cpu=used, other_cpu=other)


def run_asyncio(jobs: int, iterations: int) -> Run:
    """A single-process asyncio runner: every job's CPU work on the event loop."""

    async def job() -> None:
        spin(iterations)

    async def run_all() -> None:
        await asyncio.gather(*(job() for _ in range(jobs)))

    busy_before, cpu_before = machine_busy(), time.process_time()
    started = time.perf_counter()
    asyncio.run(run_all())
    seconds = time.perf_counter() - started
    own = time.process_time() - cpu_before
    return Run(seconds, own_cpu=own, other_cpu=machine_busy() - busy_before - own)


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.cpu", __doc__)
    p.add_argument(
        "--cases",
        type=case_list,
        default=case_list("200x50,40x500"),
        help="JOBSxMS,...: the CPU-bound runs, jobs x the CPU time of one in ms, calibrated "
        "in this process (200x50,40x500)",
    )
    p.add_argument(
        "--workers",
        type=positive,
        default=2,
        help="worker processes of the main run, and the cores the ideal assumes (%(default)s)",
    )
    p.add_argument(
        "--rounds",
        type=positive,
        default=3,
        help="rounds; each measures every mode of every case once, and start-up; medians "
        "are reported (%(default)s)",
    )
    p.add_argument(
        "--boots",
        type=positive,
        default=2,
        help="spawn -> first claim measurements (split into parts) per round (%(default)s)",
    )
    p.add_argument(
        "--imports",
        type=positive,
        default=5,
        help="fresh interpreters timed per round for `import forklift.cli` and for "
        "`python -c pass` (%(default)s)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="DIR",
        help="also measure the forklift package in DIR (another version: before -> after)",
    )
    add_quiet(p)
    p.add_argument("--single", action="store_true", help="also run `forklift run --workers 1`")
    p.add_argument(
        "--asyncio", action="store_true", help="also run a single-process asyncio runner"
    )
    return p


def add_quiet(p: argparse.ArgumentParser) -> None:
    """How d is measured, and how the bench waits for the rest of the machine."""
    p.add_argument(
        "--calibration-samples",
        type=positive,
        default=7,
        help="calls whose median is the single-call duration, for 50 ms jobs; fewer for "
        "longer ones, at least 3 (%(default)s)",
    )
    p.add_argument(
        "--quiet-cores",
        type=positive_float,
        default=0.3,
        help="before each measurement, wait until the other processes on the machine use "
        "fewer cores than this (sampled over 1 s); a run during which they used more is "
        "repeated, see --retries (%(default)s) ...",
    )
    p.add_argument(
        "--quiet-wait",
        type=float,
        default=60.0,
        help="... for at most this many seconds, then measure anyway (0: do not wait; "
        "%(default)s). The table shows the cores others used during each run.",
    )
    p.add_argument(
        "--retries",
        type=int,
        default=3,
        help="times a disturbed run is repeated; the least disturbed one counts "
        "(%(default)s). The table shows the cores others used during the runs kept.",
    )


def run_mode(
    args: argparse.Namespace, case: Case, iterations: int, cores: int, run: Callable[[], Run]
) -> Run:
    """Measure d, time `run`, measure d again; the ideal assumes `cores` cores.

    A run during which other processes kept more than --quiet-cores cores busy is
    repeated (up to --retries times); the least disturbed one is kept.
    """
    samples = max(3, min(args.calibration_samples, round(args.calibration_samples * 50 / case.ms)))
    best: Run | None = None
    for attempt in range(args.retries + 1):
        wait_quiet(args.quiet_cores, args.quiet_wait)
        d_before = single_call(iterations, samples)
        result = run()
        result.d_before = d_before
        result.d_after = single_call(iterations, samples)
        result.attempts = attempt + 1
        say(
            f"    {result.seconds:.2f} s = {result.ratio(case.jobs, cores):.3f} x ideal "
            f"{case.jobs * result.d / cores:.2f} s (d {d_before * 1e3:.1f} -> "
            f"{result.d_after * 1e3:.1f} ms); it used {result.cores_used:.2f} cores, "
            f"others {result.cores_taken:.2f}"
        )
        if best is None or result.cores_taken < best.cores_taken:
            best = result
        if result.cores_taken < args.quiet_cores:
            break
        if attempt < args.retries:
            say("    disturbed by other processes: measuring again")
    assert best is not None
    return best


def cores(runs: list[Run]) -> str:
    """Median cores the measured process(es) used / other processes used, of all."""
    used = statistics.median(r.cores_used for r in runs)
    taken = statistics.median(r.cores_taken for r in runs)
    return f"{used:.2f} / {taken:.2f} of {os.cpu_count()}"


def series(values: Sequence[float], fmt: str = "{:.3f}") -> str:
    """The median, then every round's value: "1.031 (rounds: 1.02, 1.03, 1.05)"."""
    return (
        f"{fmt.format(statistics.median(values))} (rounds: "
        + ", ".join(f"{v:.2f}" for v in values)
        + ")"
    )


def case_rows(
    args: argparse.Namespace, case: Case, runs: dict[str, list[Run]], trees: list[Tree]
) -> list[Row]:
    """One case's rows: the Pool, forklift (each tree) against it, the references."""
    n, w = case.jobs, args.workers
    med = statistics.median
    pool = runs["pool"]
    ds = [d for group in runs.values() for r in group for d in (r.d_before, r.d_after)]
    rows = [
        Row(f"{case.name}", ""),
        Row(
            "  single call d (median; min-max over all runs)",
            f"{med(ds) * 1e3:.1f} ms; {min(ds) * 1e3:.1f}-{max(ds) * 1e3:.1f} ms",
        ),
        Row(f"  ideal: {n} x d / {w} cores", f"{med(n * r.d / w for r in pool):.2f} s"),
        Row(
            f"  multiprocessing.Pool({w}).map, warm, no queue: wall / ideal",
            f"{series([r.ratio(n, w) for r in pool])} ({med(r.seconds for r in pool):.2f} s)",
        ),
        Row("    a handler's time in the Pool's processes / d", handler_time(pool)),
        Row("    cores used by the pool / by other processes", cores(pool)),
    ]
    for tree in trees:
        who = f"forklift ({tree.label})" if len(trees) > 1 else "forklift"
        rows += forklift_rows(case, w, runs[f"forklift {tree.label}"], pool, who)
    return rows + reference_rows(case, w, runs)


def forklift_rows(case: Case, w: int, main: list[Run], pool: list[Run], who: str) -> list[Row]:
    """forklift's runs of one case: wall, against the ideal and the Pool, boot, tail.

    Against the Pool: each round's walls (the two runs seconds apart), and each wall
    normalised by the d measured around it. On a shared VM a core's speed can change by
    half for seconds at a time, which a d measured just then throws the second off by as
    much: the verdict is on the rounds' walls."""
    n = case.jobs
    med = statistics.median
    ratios = [r.ratio(n, w) for r in main]
    pool_ratio = med(r.ratio(n, w) for r in pool)
    walls = [f.seconds / p.seconds for f, p in zip(main, pool, strict=True)]
    return [
        Row(
            f"  {who} run --workers {w}: spawn -> last completion",
            f"{med(r.seconds for r in main):.2f} s (the bench saw it after "
            f"{med(r.polled or 0.0 for r in main):.2f} s)",
        ),
        Row(
            f"  {who}: wall / ideal",
            series(ratios),
            f"<= {TARGET_RATIO}",
            med(ratios) <= TARGET_RATIO,
        ),
        Row(
            f"  {who} / Pool({w}): the walls of each round",
            series(walls),
            f"<= {case.target}",
            med(walls) <= case.target,
        ),
        Row(
            f"  {who} / Pool({w}): each normalised by its d",
            series([r / pool_ratio for r in ratios]),
        ),
        *cost_rows(w, main, pool, who),
    ]


def cost_rows(w: int, main: list[Run], pool: list[Run], who: str) -> list[Row]:
    """Where forklift's time goes: its start-up, the tail, its handlers, between jobs."""
    med = statistics.median
    # Without forklift's start-up (the Pool's is outside its clock): its cost per job alone.
    running = [
        (f.seconds - (f.first_claim or 0.0)) / p.seconds for f, p in zip(main, pool, strict=True)
    ]
    return [
        Row(f"  {who} after its first claim / Pool({w}): the walls of each round", series(running)),
        Row(
            "    spawn -> first claim / first success",
            f"{med(r.first_claim or 0.0 for r in main):.3f} s / "
            f"{med(r.first_success or 0.0 for r in main):.3f} s",
        ),
        Row(
            "    jobs per worker; gap between the workers' last completions",
            f"{', '.join('/'.join(map(str, r.per_worker)) for r in main)}; "
            f"{med(r.spread or 0.0 for r in main) * 1e3:.0f} ms",
        ),
        Row("    a handler's time in the workers / d", handler_time(main)),
        Row(
            "    between a worker's jobs (a handler's end -> the next's start)",
            "-"
            if any(r.gap is None for r in main)
            else f"median {med(r.gap or 0.0 for r in main) * 1e3:.2f} ms; "
            f"{med(r.gaps / w / r.seconds for r in main) * 100:.1f} % of the wall",
        ),
        Row("    cores used by forklift / by other processes", cores(main)),
    ]


def handler_time(runs: list[Run]) -> str:
    """A handler's mean time over d (median of the runs): above 1, the handler ran slower
    than the same call alone in this process (the other processes on the two cores, the
    threads beside it in its own)."""
    if any(r.handler is None for r in runs):
        return "-"
    med = statistics.median
    ratio = med((r.handler or 0.0) / r.d for r in runs)
    return f"{ratio:.3f} (mean {med(r.handler or 0.0 for r in runs) * 1e3:.1f} ms)"


def reference_rows(case: Case, w: int, runs: dict[str, list[Run]]) -> list[Row]:
    """`forklift run --workers 1` and the asyncio runner, if they ran."""
    n = case.jobs
    med = statistics.median
    rows = []
    if runs.get("single"):
        one = runs["single"]
        rows += [
            Row(
                "  forklift run --workers 1: wall / (n x d)",
                f"{med(r.ratio(n, 1) for r in one):.3f} ({med(r.seconds for r in one):.2f} s)",
            ),
            Row("    cores used by forklift / by other processes", cores(one)),
        ]
    if runs.get("asyncio"):
        aio = runs["asyncio"]
        rows += [
            Row(
                f"  asyncio runner (1 process, gather): wall / ideal ({w} cores)",
                f"{med(r.ratio(n, w) for r in aio):.3f} ({med(r.seconds for r in aio):.2f} s)",
            ),
            Row("    cores used by the runner / by other processes", cores(aio)),
        ]
    return rows


# The parts of spawn -> first claim: (label, from mark, to mark); None: the spawn.
PARTS = [
    ("interpreter start (python, site)", None, "interpreter"),
    ("import forklift.cli", "interpreter", "cli_imported"),
    ("parse, log setup, import the supervisor", "cli_imported", "app_import.begin"),
    ("import the app", "app_import.begin", "app_import.end"),
    ("config, Supervisor built", "app_import.end", "supervisor_run"),
    ("metrics bind, gc, the fork server started", "supervisor_run", "fork_server"),
    ("fork server up -> the first fork asked", "fork_server", "fork"),
    ("fork -> the child runs", "fork", "child"),
    ("child: Worker built", "child", "boot.begin"),
    ("child: boot to its pools opened", "boot.begin", "pools_opened"),
    ("child: rest of its boot (services)", "pools_opened", "boot.end"),
    ("child: boot end -> its first connection", "boot.end", "first_connection"),
    ("child: first connection -> first claim", "first_connection", "first_claim"),
]


def boot_rows(boots: dict[str, list[dict[str, float]]], trees: list[Tree]) -> list[Row]:
    """Spawn -> first claim, part by part (medians): with --baseline, before -> after."""

    def part(marks: list[dict[str, float]], start: str | None, end: str) -> str:
        values = [
            m[end] - (m[start] if start else 0.0)
            for m in marks
            if end in m and (start is None or start in m)
        ]
        return f"{statistics.median(values) * 1e3:.0f} ms" if values else "-"

    order = trees[::-1]  # the baseline (before) first
    versions = " -> ".join(t.label for t in order)
    rows = [Row(f"spawn -> first claim, by part (medians; {versions})", "")]
    for label, start, end in PARTS:
        rows.append(Row(f"  {label}", " -> ".join(part(boots[t.label], start, end) for t in order)))
    for tree in trees:
        total = [m["first_claim"] for m in boots[tree.label]]
        rows.append(
            Row(
                f"  spawn -> first claim{f' ({tree.label})' if len(trees) > 1 else ''}",
                series(total),
                f"<= {FIRST_CLAIM_TARGET} s",
                statistics.median(total) <= FIRST_CLAIM_TARGET,
            )
        )
    return rows


def import_rows(imports: dict[str, list[float]], trees: list[Tree]) -> list[Row]:
    med = statistics.median
    bare = med(imports["pass"])
    rows = [Row("python -c pass (fresh interpreter, wall)", f"{bare:.3f} s")]
    for tree in trees:
        values = imports[f"cli {tree.label}"]
        who = f" ({tree.label})" if len(trees) > 1 else ""
        rows.append(
            Row(
                f"python -c 'import forklift.cli'{who}: wall; above the bare interpreter",
                f"{med(values):.3f} s; {med(values) - bare:.3f} s",
                f"<= {IMPORT_TARGET} s",
                med(values) - bare <= IMPORT_TARGET,
            )
        )
    return rows


Modes = list[tuple[str, str, int, Callable[[], Run]]]


def modes(
    args: argparse.Namespace, bench: CpuBench, case: Case, iterations: int, trees: list[Tree]
) -> Modes:
    """What one round measures of `case`: (key, label, the ideal's cores, the run)."""
    n, w = case.jobs, args.workers
    found: Modes = [
        (
            f"forklift {t.label}",
            f"forklift ({t.label}) run --workers {w}",
            w,
            functools.partial(bench.run_forklift, n, iterations, w, t),
        )
        for t in trees
    ]
    found.append(("pool", f"multiprocessing.Pool({w})", w, lambda: run_pool(n, iterations, w)))
    if args.single:
        found.append(
            ("single", "forklift run --workers 1", 1, lambda: bench.run_forklift(n, iterations, 1))
        )
    if args.asyncio:
        found.append(("asyncio", "asyncio runner", w, lambda: run_asyncio(n, iterations)))
    return found


@dataclass
class Results:
    """Every measurement of the run, by what it measured."""

    runs: dict[Case, dict[str, list[Run]]]
    boots: dict[str, list[dict[str, float]]]
    imports: dict[str, list[float]] = field(default_factory=dict)


def start_up(args: argparse.Namespace, bench: CpuBench, trees: list[Tree], out: Results) -> None:
    """One round's start-up measurements: imports, then spawn -> first claim."""
    wait_quiet(args.quiet_cores, args.quiet_wait)
    for _ in range(args.imports):
        out.imports.setdefault("pass", []).append(import_seconds(HERE, "pass", bench.env))
        for t in trees:
            out.imports.setdefault(f"cli {t.label}", []).append(
                import_seconds(t, "import forklift.cli", bench.env)
            )
    for _ in range(args.boots):
        for t in trees:
            out.boots[t.label].append(bench.boot(t, args.workers))


def measure(args: argparse.Namespace, bench: CpuBench, trees: list[Tree]) -> Results:
    """Calibrate each case, then --rounds rounds of start-up and of every case's modes."""
    out = Results({case: {} for case in args.cases}, {t.label: [] for t in trees})
    wait_quiet(args.quiet_cores, args.quiet_wait)
    iterations = {}
    for case in args.cases:
        iterations[case] = calibrate(case.ms / 1000, args.calibration_samples)
        say(f"calibrated: spin({iterations[case]:,}) takes ~{case.ms:g} ms here")
    for i in range(args.rounds):
        say(f"round {i + 1}/{args.rounds}: start-up ...")
        start_up(args, bench, trees, out)
        for case in args.cases:
            found = modes(args, bench, case, iterations[case], trees)
            turn = i % len(found)  # each round another mode first (none always on a cold
            for key, label, ideal_cores, run in found[turn:] + found[:turn]:  # cache)
                say(f"round {i + 1}/{args.rounds}, {case.name}, {label} ...")
                out.runs[case].setdefault(key, []).append(
                    run_mode(args, case, iterations[case], ideal_cores, run)
                )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    trees = [HERE] + ([Tree("baseline", args.baseline.resolve())] if args.baseline else [])
    if args.baseline and not (args.baseline / "forklift" / "__init__.py").exists():
        raise SystemExit(f"--baseline {args.baseline}: no forklift package in it")
    for tree in trees:  # as an installed package is: its bytecode compiled, whatever
        # PYTHONDONTWRITEBYTECODE says (else each start would compile what lacks it)
        compileall.compile_dir(tree.path / "forklift", quiet=1)
    compileall.compile_dir(REPO_ROOT / "bench", quiet=1)
    load_start = load_average()
    with CpuBench(args.dsn).session() as bench:
        out = measure(args, bench, trees)
    rows = import_rows(out.imports, trees) + boot_rows(out.boots, trees)
    for case in args.cases:
        rows += case_rows(args, case, out.runs[case], trees)
    every = [r for case in args.cases for group in out.runs[case].values() for r in group]
    rows.append(
        Row(
            "runs repeated because other processes were busy",
            f"{sum(r.attempts - 1 for r in every)} (of {len(every)} kept)",
        )
    )
    versions = " and ".join(f"{t.label} = {t.path}" for t in trees)
    note = (
        f"bench.cpu: {', '.join(c.name for c in args.cases)} on {args.workers} workers, median "
        f"of {args.rounds} round(s), each ratio against the d measured around its own run; "
        f"forklift: {versions}; {os.cpu_count()} CPUs, load average {load_start} at start, "
        f"{load_average()} at end"
    )
    print_table(rows, note, MET)
    bench.print_logged()
    return 0


if __name__ == "__main__":
    sys.exit(main())
