"""Soak: a random fault every second against a workload, for --minutes; what broke?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.soak --minutes 2
    .venv/bin/python -m bench.soak --minutes 10 --concurrency 4   # unattended, ~15 min

It starts a private PostgreSQL cluster of its own (forklift.embedded.Cluster: initdb in
a temporary directory, its own port), a TCP proxy in front of it, a schema with the fault
tests' workload (tests/faults/workload.py: CPU work, then one effect row per commit in a
table without a unique key) and --supervisors `forklift run` supervisors connected
through the proxy. Then, until --minutes have passed, once a second at most: it tops the
backlog up to --backlog jobs, picks a fault at random (tests/faults/injector.py: SIGKILL
or SIGSTOP of a worker, a pg_terminate_backend storm, a database restart or an outage of
--outage seconds, SIGKILL of a supervisor or of its whole process group, SIGTERM, a TCP
cut or stall of --blip seconds; a killed supervisor is started again, as systemd would),
injects it, and measures the recovery: seconds from the fault's end (the database back,
the network healed, the process restarted) to the next job that succeeded.

At the end it stops injecting, waits for every job to finish, and checks what the fault
tests check: each job succeeded (or is dead, for the poisoned ones it adds now and then),
each key's effect exists once, no job ran more than max_attempts times. A job lost or an
effect doubled is charged to the last fault injected before it. It prints one row per
fault kind (injected, recovered, max recovery time, lost, doubled) and appends a JSON row
for the run to --results (bench/results/soak.jsonl). Exit code 1 if anything was lost or
doubled, or a fault was never recovered from.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

if not __package__:  # run as `python bench/soak.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    REPO_ROOT,
    append_result,
    parser,
    positive,
    positive_float,
    print_grid,
    say,
    sigterm_exits,
)
from forklift.embedded import Cluster
from tests.acceptance.proxy import Proxy
from tests.faults.harness import Fleet, Verdict, Workload
from tests.faults.injector import Fault, Injection, Injector

# Outages are long: they come a fifth as often as the other faults.
WEIGHTS = {fault: (0.2 if fault is Fault.DB_OUTAGE else 1.0) for fault in Fault}


@dataclass
class Tally:
    """One fault kind over the run."""

    injected: int = 0
    recovered: int = 0
    max_recovery: float = 0.0
    lost: int = 0
    doubled: int = 0
    readyz_missed: int = 0  # outages during which a supervisor never said 503


@dataclass
class Run:
    """What the soak did, fault by fault."""

    tallies: dict[Fault, Tally] = field(default_factory=lambda: {f: Tally() for f in Fault})
    injections: list[tuple[float, Fault]] = field(default_factory=list)  # (wall time, kind)

    def record(self, injection: Injection, started_wall: float, recovery: float | None) -> None:
        tally = self.tallies[injection.fault]
        tally.injected += 1
        self.injections.append((started_wall, injection.fault))
        if recovery is not None:
            tally.recovered += 1
            tally.max_recovery = max(tally.max_recovery, recovery)
        if injection.readyz_503 is False:
            tally.readyz_missed += 1

    def blame(self, at: float) -> Fault | None:
        """The last fault injected before wall time `at`."""
        before = [fault for when, fault in self.injections if when <= at]
        return before[-1] if before else None


def inject_for(injector: Injector, workload: Workload, args: argparse.Namespace, run: Run) -> None:
    """A fault a second (at most) until --minutes have passed, the backlog kept up."""
    rng = random.Random(args.seed)
    injector.rng = rng
    kinds = args.faults or list(WEIGHTS)
    weights = [WEIGHTS[k] for k in kinds]
    deadline = time.monotonic() + args.minutes * 60
    while time.monotonic() < deadline:
        began = time.monotonic()
        top_up(workload, args.backlog, rng)
        fault = rng.choices(kinds, weights)[0]
        wall = time.time()
        injection = injector.inject(fault)
        recovery = injector.recovery(injection.over, timeout=args.recovery_timeout)
        run.record(injection, wall, recovery)
        shown = "never" if recovery is None else f"{recovery:.2f}s"
        say(f"  {fault.value:<17} {injection.detail:<16} recovered after {shown}")
        time.sleep(max(0.0, began + 1.0 - time.monotonic()))


def top_up(workload: Workload, backlog: int, rng: random.Random) -> None:
    left = workload.unfinished()
    if left is not None and left < backlog:
        workload.enqueue(backlog - left, spins=20_000, pause=0.02)
        if rng.random() < 0.1:
            workload.enqueue_poison(1)


def charge(workload: Workload, verdict: Verdict, run: Run) -> None:
    """Charge each doubled effect (at its second commit) and each lost job (at its last
    start) to the fault injected just before."""
    second_commit = (
        "SELECT extract(epoch FROM (array_agg(at ORDER BY at))[2])::float8"
        " FROM {s}.effects WHERE key = %s"
    )
    last_start = (
        "SELECT extract(epoch FROM coalesce(started_at, created_at))::float8"
        " FROM {s}.jobs WHERE id = %s"
    )
    blamed: list[tuple[str, str, str | int]] = [
        ("doubled", second_commit, key) for key in verdict.doubled
    ]
    blamed += [("lost", last_start, i) for i in [*verdict.not_finished, *verdict.wrongly_dead]]
    for what, sql, which in blamed:
        fault = run.blame(float(workload.scalar(sql, which) or 0))
        if fault is not None:
            tally = run.tallies[fault]
            setattr(tally, what, getattr(tally, what) + 1)


def report(run: Run, verdict: Verdict, args: argparse.Namespace, seconds: float) -> None:
    cells = [("fault", "injected", "recovered", "max recovery", "lost", "doubled")]
    for fault, t in run.tallies.items():
        worst = f"{t.max_recovery:.2f} s" if t.recovered else "-"
        cells.append(
            (fault.value, str(t.injected), str(t.recovered), worst, str(t.lost), str(t.doubled))
        )
    title = (
        f"forklift soak: {args.minutes:g} min of faults, {args.supervisors} supervisors x "
        f"{args.workers} workers x concurrency {args.concurrency}; {verdict.jobs:,} jobs "
        f"({verdict.succeeded:,} succeeded, {verdict.dead} dead), {seconds:.0f} s in all"
    )
    print_grid(title, cells, right_align=True)
    for problem in verdict.problems:
        print(f"PROBLEM: {problem}")


def save(run: Run, verdict: Verdict, args: argparse.Namespace, seconds: float) -> None:
    row = {
        "minutes": args.minutes,
        "seed": args.seed,
        "supervisors": args.supervisors,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "seconds": round(seconds),
        "jobs": verdict.jobs,
        "succeeded": verdict.succeeded,
        "dead": verdict.dead,
        "lost": len(verdict.not_finished) + len(verdict.wrongly_dead),
        "doubled": len(verdict.doubled),
        "problems": verdict.problems,
        "faults": {f.value: vars(t) for f, t in run.tallies.items()},
    }
    append_result(args.results, row)


def soak(args: argparse.Namespace) -> int:
    began = time.monotonic()
    logdir = Path(tempfile.mkdtemp(prefix="forklift-soak-"))
    with Cluster(prefix="forklift-soak-") as cluster:
        proxy = Proxy.to(cluster.dsn)
        workload = Workload(cluster.dsn)
        workload.create()
        flags = [
            "--workers",
            str(args.workers),
            "--concurrency",
            str(args.concurrency),
            "--lease",
            f"{args.lease}s",
            "--grace",
            "5s",
        ]
        fleet = Fleet.for_workload(workload, logdir, flags, proxy.dsn_through(cluster.dsn))
        run = Run()
        try:
            fleet.start(args.supervisors)
            fleet.wait_ready()
            injector = Injector(cluster, proxy, fleet, workload, args.lease, args.outage, args.blip)
            inject_for(injector, workload, args, run)
            say("faults over: waiting for every job to finish ...")
            with contextlib.suppress(AssertionError):
                workload.wait_finished(timeout=args.finish_timeout)
            verdict = workload.verdict()
            charge(workload, verdict, run)
            fleet.check_alive()
        finally:
            fleet.kill()
            proxy.cut()
            workload.drop()
    seconds = time.monotonic() - began
    report(run, verdict, args, seconds)
    save(run, verdict, args, seconds)
    never = sum(t.injected - t.recovered for t in run.tallies.values())
    return 1 if verdict.problems or never else 0


def fault_list(text: str) -> list[Fault]:
    try:
        return [Fault(kind.strip()) for kind in text.split(",") if kind.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: choose from " + ", ".join(f.value for f in Fault)
        ) from None


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.soak", __doc__)
    p.add_argument("--minutes", type=positive_float, default=2.0, help="of faults (%(default)s)")
    p.add_argument("--supervisors", type=positive, default=2, help="(%(default)s)")
    p.add_argument("--workers", type=positive, default=2, help="per supervisor (%(default)s)")
    p.add_argument("--concurrency", type=positive, default=1, help="per worker (%(default)s)")
    p.add_argument("--lease", type=positive_float, default=3.0, help="seconds (%(default)s)")
    p.add_argument(
        "--outage",
        type=positive_float,
        default=20.0,
        help="seconds the database stays down in a 'db down' fault (%(default)s)",
    )
    p.add_argument(
        "--blip",
        type=positive_float,
        default=2.0,
        help="seconds a TCP cut or stall lasts (%(default)s)",
    )
    p.add_argument("--backlog", type=positive, default=1000, help="jobs kept due (%(default)s)")
    p.add_argument("--seed", type=int, default=None, help="for the random faults")
    p.add_argument(
        "--faults",
        type=fault_list,
        default=None,
        metavar="KIND,...",
        help="inject only these kinds (default: all): " + ", ".join(f.value for f in Fault),
    )
    p.add_argument(
        "--recovery-timeout",
        type=positive_float,
        default=60.0,
        help="past this, a fault counts as never recovered from (%(default)s)",
    )
    p.add_argument(
        "--finish-timeout",
        type=positive_float,
        default=300.0,
        help="seconds to wait for the last jobs at the end (%(default)s)",
    )
    p.add_argument(
        "--results",
        type=Path,
        default=REPO_ROOT / "bench" / "results" / "soak.jsonl",
        help="the JSON lines file a row per run is appended to",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.seed is None:
        args.seed = random.randrange(2**31)
    say(f"soak: {args.minutes:g} min, seed {args.seed}")
    with sigterm_exits():
        return soak(args)


if __name__ == "__main__":
    sys.exit(main())
