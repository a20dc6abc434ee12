"""forklift side by side with pgqueuer, procrastinate and Celery, on this machine.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.compare              # everything, 3 rounds (~20 min)
    .venv/bin/python -m bench.compare --quick      # small sizes, 1 round: a smoke run
    .venv/bin/python -m bench.compare --only drain,latency --peers pgqueuer

The peers are never forklift's dependencies: they live in .venv-peers, a venv of their
own (git-ignored) made on first run with `python -m venv` and pip: pgqueuer 1.6 (with
asyncpg), procrastinate 3.10, Celery 5.7 with Redis, and matplotlib for the chart. Their
producers and workers (bench/peers/) run as processes of that venv's python; forklift
runs from this one. Celery needs the Redis at --redis; if none answers it is skipped
(and the output says so). Every run works in a fresh database `bench_compare_<hex>`,
dropped at the end (also on error, Ctrl-C or SIGTERM), with every process it started.

Every workload runs for each contender in turn, the order rotated each round, for
--rounds rounds; the tables give the median (min-max) and the ratio forklift / peer,
oriented so that > 1 means forklift is better (a higher rate or a shorter time).

Workloads (--only takes a comma-separated list of them):

  enqueue   20,000 no-op jobs in bulk, in batches of 10,000 (forklift: enqueue_many,
            COPY; pgqueuer: Queries.enqueue with lists, one INSERT ... UNNEST;
            procrastinate: Task.batch_defer_async; Celery, which has no bulk publish:
            one apply_async per job on one producer connection),
            then 1,000 one call each. The clock covers the enqueue calls only.
  drain     20,000 ready no-ops, drained by 2 worker processes, timed from their spawn
            (interpreter boot included) until the last is done, polled every 50 ms; the
            10-90% rate leaves boot and tail out. Two settings each: "defaults" (the
            contender's defaults, 2 processes) and "best" (its best documented setting
            for tiny jobs on 2 cores, below).
  limit     PostgreSQL's own limit for forklift's statements (bench/pg_limit.py): its
            job_claim_one + job_complete_many from forklift/store/queries.sql looped on 4
            connections (2 workers x a claim and a completion connection), in 4
            processes, no Python work; 1 job per round trip and batches of 128 (what a
            prefetching worker claims of no-ops is tens of jobs at a time, at most 256).
  effect    10,000 jobs that each INSERT one row in ctx.transaction() (committed with the
            job's completion), forklift only (no peer commits a handler's writes with its
            completion): the 10-90% drain rate at its defaults (each worker waits for one
            WAL flush per job) and at --concurrency 8 and 32 (a worker's threads share
            flushes).
  latency   500 jobs at 200/s to 1 idle worker process; latency = the handler's first
            act (time.time()) minus the producer's time.time() just before its enqueue
            call, one clock. Reference: the bare floor (bench/floor.py), INSERT + NOTIFY
            -> LISTEN -> one SKIP LOCKED claim, psycopg, no library.
  cpu       200 jobs x 50 ms of pure Python (bench.cpu_app.spin, calibrated here),
            already enqueued; the wall time from spawning the 2 worker processes (for
            forklift bench.cpu's `forklift run --workers 2`) until the last is done.
            Reference: multiprocessing.Pool(2) with the same 200 calls, from its spawn.
  recovery  a worker busy with a 5 s job is SIGKILLed: how long until that job is
            running again (forklift: bench.restart's measurement; peers: 2 worker
            processes at their defaults, what happens is reported, "never" when not
            within --recovery-timeout). Nothing restarts a killed pgqueuer or
            procrastinate process (they have no supervisor); Celery's main process
            replaces a killed pool process.
  backlog   the 10-90% drain rate of the first 10,000 jobs with 1,000,000 ready vs with
            10,000 ready, best setting (forklift only; --backlog-peers adds the peers,
            minutes more: Celery publishes 1,000,000 messages one by one).
  sweep     (only with --only) each contender's drain at a few values of its main knob,
            once per round: how the "best" values below were found.

"Best configuration" for tiny jobs on 2 cores: the project's documented advice for short
jobs, its knob set to the fastest value of a sweep (`--only sweep`; 10,000-20,000 no-ops
on this machine while other test suites ran on it: worth re-running in a quiet window;
the --best-* flags change the values):

  forklift       forklift run --workers 2 --concurrency 4. Since workers claim ahead of
                 their slots (adaptive prefetch) the defaults are as fast as any
                 setting: 40,000 no-ops, 10-90 %: concurrency 1 ~ 4 > 16 > 128
                 (10,976 / 10,962 / 10,162 / 8,634 jobs/s); 4 is the fastest but one.
  pgqueuer       2 x `pgq run --batch-size 500`: its performance-tuning guide says to
                 increase batch_size (default 10) when jobs are short-lived, with no
                 number; 500 was the fastest of 10/50/100/200/500 (still rising). Its
                 docs name asyncpg its fastest driver, which both settings use.
  procrastinate  2 x `procrastinate worker --concurrency 200`, async tasks: --concurrency
                 is "the number of parallel asynchronous jobs to process at once"
                 (default 1); 200 was the fastest of 1/25/50/100/200/500.
  Celery         `celery worker -P prefork -c 2 --prefetch-multiplier 128`: its Optimizing
                 guide says that with many short tasks the prefetch multiplier (default
                 4) should be large, "64 or 128"; 128 was the fastest of 4/16/64/128.

Every contender runs at log level WARNING (procrastinate's default INFO logs a line per
job). Progress goes to stderr, the tables to stdout; --json and --png write the results
and a chart of the ratios (drawn by bench/peers/chart.py in the peers venv).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/compare.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _peers_env, _results
from bench._contenders import Contender, Floor, Forklift
from bench._harness import (
    REPO_ROOT,
    fresh_database,
    load_average,
    parser,
    positive,
    positive_float,
    say,
    sigterm_exits,
)
from bench._peers import PEERS, Celery, Peer
from bench._workloads import EXTRA, WORKLOADS, Comparison, Plan

RESULTS = REPO_ROOT / "bench" / "results"
# The main knob of each contender's "best" drain setting, and its value (see --help).
BEST = {
    "forklift": ("--concurrency", 4),
    "pgqueuer": ("--batch-size", 500),
    "procrastinate": ("--concurrency", 200),
    "celery": ("--prefetch-multiplier", 128),
}


def names(choices: Sequence[str]) -> Any:
    """argparse type: a comma-separated subset of `choices` (may be empty)."""

    def parse(text: str) -> list[str]:
        picked = [n.strip() for n in text.split(",") if n.strip()]
        unknown = [n for n in picked if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown: {', '.join(unknown)} (of {choices})")
        return picked

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.compare", __doc__)
    p.add_argument("--rounds", type=positive, default=3, help="rounds of every workload (3)")
    p.add_argument(
        "--jobs", type=positive, default=20_000, help="jobs to enqueue and drain (20000)"
    )
    p.add_argument(
        "--only",
        type=names(WORKLOADS + EXTRA),
        default=list(WORKLOADS),
        metavar="WORKLOAD[,...]",
        help=f"workloads to run, of {', '.join(WORKLOADS + EXTRA)} (all but sweep)",
    )
    p.add_argument(
        "--peers",
        type=names(tuple(PEERS)),
        default=list(PEERS),
        metavar="PEER[,...]",
        help="peers to compare with, of pgqueuer, procrastinate, celery (all; '' for none)",
    )
    p.add_argument("--quick", action="store_true", help="small sizes, 1 round: a smoke run")
    p.add_argument(
        "--json",
        type=Path,
        help="results file (bench/results/compare.json; with --quick compare-quick.json)",
    )
    p.add_argument(
        "--png",
        type=Path,
        help="chart of the ratios (bench/results/compare.png; with --quick compare-quick.png)",
    )
    p.add_argument(
        "--redis", default="redis://127.0.0.1:6379/0", help="Celery's broker (%(default)s)"
    )
    p.add_argument(
        "--recovery-timeout",
        type=positive_float,
        default=90.0,
        help="seconds to wait for a killed job to run again before saying never (90)",
    )
    p.add_argument(
        "--backlog-peers", action="store_true", help="run the 1M-backlog workload for peers too"
    )
    for who, (knob, value) in BEST.items():
        p.add_argument(
            f"--best-{who}",
            type=positive,
            default=value,
            metavar="N",
            help=f"the {knob} of {who}'s best drain setting (%(default)s)",
        )
    return p


def plan_of(args: argparse.Namespace) -> Plan:
    if args.quick:
        args.rounds = 1
        return Plan(
            jobs=min(args.jobs, 2_000),
            batch=1_000,
            one_by_one=200,
            latency_jobs=100,
            cpu_jobs=40,
            nap=2.0,
            recovery_timeout=min(args.recovery_timeout, 60.0),
            backlog_large=100_000,
            backlog_measure=2_000,
            backlog_peers=args.backlog_peers,
            effect_jobs=min(args.jobs, 2_000),
        )
    return Plan(
        jobs=args.jobs,
        recovery_timeout=args.recovery_timeout,
        backlog_peers=args.backlog_peers,
    )


def open_contenders(
    stack: contextlib.ExitStack, args: argparse.Namespace, dsn: str, python: Path
) -> list[Contender]:
    """forklift and the peers asked for, each in its session (stopped and dropped at the end)."""
    contenders: list[Contender] = [stack.enter_context(Forklift(dsn, args.best_forklift).session())]
    for name in args.peers:
        best = getattr(args, f"best_{name}")
        peer: Peer
        if name == "celery":
            if not _peers_env.redis_answers(args.redis):
                say(f"no Redis answers at {args.redis}: Celery is skipped")
                continue
            peer = Celery(dsn, python, best, args.redis, f"bench_compare_{secrets.token_hex(4)}")
        else:
            peer = PEERS[name](dsn, python, best)
        contenders.append(stack.enter_context(peer.session()))
    return contenders


def measure(args: argparse.Namespace, python: Path) -> tuple[Comparison, list[str]]:
    """Run the workloads in a fresh database; every process and table gone on return."""
    plan = plan_of(args)
    with sigterm_exits(), contextlib.ExitStack() as stack:
        dsn = stack.enter_context(fresh_database(args.dsn, "bench_compare"))
        contenders = open_contenders(stack, args, dsn, python)
        floor = stack.enter_context(Floor(dsn).session()) if "latency" in args.only else None
        comparison = Comparison(plan, contenders, floor)
        comparison.run([w for w in WORKLOADS + EXTRA if w in args.only], args.rounds)
    return comparison, [c.name for c in contenders]


def report(
    args: argparse.Namespace, comparison: Comparison, who: list[str], meta: dict[str, Any]
) -> None:
    metrics = list(comparison.metrics.values())
    peers = who[1:]
    print(f"\nbench.compare: {meta['environment']}")
    _results.print_values(metrics, who)
    _results.print_ratios([m for m in metrics if not m.key.startswith("sweep.")], peers)
    print("\nHow each contender ran:")
    for name, notes in comparison.settings.items():
        for workload, text in notes.items():
            print(f"  {name:13} {workload:15} {text}")
    sys.stdout.flush()
    stem = "compare-quick" if args.quick else "compare"
    json_path = args.json or RESULTS / f"{stem}.json"
    png_path = args.png or RESULTS / f"{stem}.png"
    _results.write(
        json_path, _results.to_json(metrics, peers, meta | {"settings": comparison.settings})
    )
    say(f"wrote {json_path}")
    chart = [str(meta["peers_python"]), "-m", "bench.peers.chart", str(json_path), str(png_path)]
    subprocess.run(chart, cwd=REPO_ROOT, check=True)
    say(f"wrote {png_path}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    python = _peers_env.ensure()
    versions = _peers_env.versions(python)
    began = time.perf_counter()
    load = load_average()
    comparison, who = measure(args, python)
    environment = (
        f"{len(who) - 1} peer(s), {args.rounds} round(s), {time.perf_counter() - began:.0f} s; "
        f"{os.cpu_count()} CPUs, load average {load} at start, {load_average()} at end; "
        + ", ".join(f"{k} {v}" for k, v in versions.items())
    )
    meta = {"environment": environment, "quick": args.quick, "peers_python": str(python)}
    report(args, comparison, who, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
