"""I/O-bound async jobs: forklift's event loop against the ideal, pgqueuer and procrastinate.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.async_jobs                   # 10,000 jobs, 3 rounds
    .venv/bin/python -m bench.async_jobs --rounds 1 --peers none

Each of --jobs jobs (10,000) awaits asyncio.sleep(--sleep) (0.05 s), as an HTTP call
would. They are enqueued first; then the contender's 2 worker processes are spawned and
timed from the spawn (interpreter boot included) until the last job is done, polled every
20 ms. Every contender runs 2 processes x 200 jobs at once:

  forklift       forklift run bench.compare_app:app --workers 2 --concurrency 200
                 (the "asleep" task is an async def: the workers' event loops run it)
  procrastinate  2 x procrastinate worker --concurrency 200 (its async tasks on its loop)
  pgqueuer       2 x pgq run --batch-size 100 --max-concurrent-tasks 200 (its hard cap
                 on a worker's jobs at once, which must be at least twice the batch)

Ideal: jobs x sleep / 400 slots = 1.25 s; target: ideal / wall >= 0.8 for forklift, and
its rate (jobs / wall) at least each peer's, in the same run. Shown too: when the first
job was done (the boot: interpreter, imports, fork, connections, then one job's sleep),
and forklift's ideal / (wall - boot), its speed once its workers run. The rounds rotate the
order; medians are reported (and the 10-90 % rate, boot and tail left out). The peers
live in .venv-peers (bench._peers_env, made on first use). Everything happens in a fresh
database, dropped at the end (also on error, Ctrl-C or SIGTERM); the results go to
bench/results/async_jobs.json.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/async_jobs.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _peers_env
from bench._contenders import WORKERS, Contender, Forklift, Setting
from bench._harness import (
    MET,
    REPO_ROOT,
    Row,
    fresh_database,
    load_average,
    non_negative_float,
    parser,
    positive,
    positive_float,
    print_grid,
    print_table,
    say,
    sigterm_exits,
    wait_quiet,
)
from bench._peers import Peer, Pgqueuer, Procrastinate
from bench.compare_app import register_asleep

RESULTS = REPO_ROOT / "bench" / "results" / "async_jobs.json"
CONCURRENCY = 200  # jobs at once per worker process, every contender
TARGET_OF_IDEAL = 0.8


class AsyncForklift(Forklift):
    """forklift with the "asleep" task on its producer, run at --concurrency 200."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, CONCURRENCY)
        register_asleep(self.app)
        self.setting = self.run_setting("async", WORKERS, "--concurrency", str(CONCURRENCY))

    def fill_asleep(self, jobs: int, seconds: float) -> None:
        self.reset()
        for done in range(0, jobs, 5_000):
            size = min(5_000, jobs - done)
            self.app.enqueue_many([("asleep", {"seconds": seconds})] * size)
        self.db.execute(f"ANALYZE {self.schema}.jobs")


def peer_setting(peer: Peer) -> Setting:
    options: tuple[str, ...]
    if isinstance(peer, Pgqueuer):
        options = ("--batch-size", "100", "--max-concurrent-tasks", str(CONCURRENCY))
    else:
        options = ("--concurrency", str(CONCURRENCY))
    return peer.make_setting("async", WORKERS, *peer.worker(*options))


def fill(contender: Contender, jobs: int, seconds: float) -> None:
    if isinstance(contender, AsyncForklift):
        contender.fill_asleep(jobs, seconds)
    else:
        assert isinstance(contender, Peer)
        contender.reset()
        contender.cli("enqueue", "asleep", jobs, "--kwargs", json.dumps({"seconds": seconds}))
        contender.enqueued += jobs
        contender.analyze()


def run_once(contender: Contender, args: argparse.Namespace) -> dict[str, float]:
    """One timed drain of the jobs: wall seconds from spawn, and the 10-90 % rate."""
    fill(contender, args.jobs, args.sleep)
    wait_quiet(0.5, args.quiet_wait)
    processing = contender.process(args.jobs, WORKERS, CONCURRENCY, timeout=args.timeout)
    steady = processing.steady_rate
    first = processing.first_job_after
    return {
        "wall": processing.seconds,
        "steady": steady if steady is not None else 0.0,
        "first_done": first if first is not None else 0.0,
    }


def measure(args: argparse.Namespace, python: Path | None) -> dict[str, list[dict[str, float]]]:
    runs: dict[str, list[dict[str, float]]] = {}
    with sigterm_exits(), contextlib.ExitStack() as stack:
        dsn = stack.enter_context(fresh_database(args.dsn, "bench_async"))
        contenders: list[Contender] = [stack.enter_context(AsyncForklift(dsn).session())]
        for name in args.peers:
            assert python is not None
            kind = Pgqueuer if name == "pgqueuer" else Procrastinate
            peer = stack.enter_context(kind(dsn, python, CONCURRENCY).session())
            peer.setting = peer_setting(peer)
            peer.poll_interval = 0.02
            contenders.append(peer)
        contenders[0].poll_interval = 0.02
        for round_ in range(args.rounds):
            turn = round_ % len(contenders)
            for contender in contenders[turn:] + contenders[:turn]:
                say(f"round {round_ + 1}/{args.rounds}: {contender.name} ...")
                run = run_once(contender, args)
                say(
                    f"    {args.jobs / run['wall']:,.0f} jobs/s, {run['wall']:.2f} s "
                    f"(the first done after {run['first_done']:.2f} s)"
                )
                runs.setdefault(contender.name, []).append(run)
    return runs


def report(
    args: argparse.Namespace, runs: dict[str, list[dict[str, float]]], meta: dict[str, Any]
) -> bool:
    ideal = args.jobs * args.sleep / (WORKERS * CONCURRENCY)
    walls = {name: statistics.median(r["wall"] for r in rs) for name, rs in runs.items()}
    rates = {name: args.jobs / wall for name, wall in walls.items()}
    cells = [
        ("", "wall s (median)", "min-max", "jobs/s", "10-90% jobs/s", "first done s",
         "ideal / wall"),
    ]  # fmt: skip
    for name, rs in runs.items():
        w = [r["wall"] for r in rs]
        steady = statistics.median(r["steady"] for r in rs)
        first = statistics.median(r["first_done"] for r in rs)
        cells.append((
            name, f"{walls[name]:.2f}", f"{min(w):.2f}-{max(w):.2f}", f"{rates[name]:,.0f}",
            f"{steady:,.0f}", f"{first:.2f}", f"{ideal / walls[name]:.2f}",
        ))  # fmt: skip
    print_grid(
        f"{args.jobs:,} jobs x asyncio.sleep({args.sleep:g}), {WORKERS} processes x "
        f"{CONCURRENCY} at once each; ideal {ideal:.2f} s; {args.rounds} round(s)",
        cells,
        right_align=True,
    )
    speed = ideal / walls["forklift"]
    rows = [Row("forklift: ideal / wall", f"{speed:.2f}", f">= {TARGET_OF_IDEAL}", speed >= 0.8)]
    # What the boot (interpreter, imports, fork, connect: until the first job could have
    # started) leaves out: the rate once the workers run.
    booted = statistics.median(r["wall"] - (r["first_done"] - args.sleep) for r in runs["forklift"])
    rows.append(Row("forklift: ideal / (wall - boot)", f"{ideal / booted:.2f}"))
    for name in runs:
        if name != "forklift":
            ratio = rates["forklift"] / rates[name]
            rows.append(Row(f"forklift / {name} (rate)", f"{ratio:.2f}x", ">= 1", ratio >= 1))
    print_table(rows, f"bench.async_jobs: {meta['environment']}", MET)
    path = args.json or RESULTS
    path.write_text(
        json.dumps(
            {**meta, "ideal_seconds": ideal, "median_wall": walls, "rate": rates, "runs": runs},
            indent=2,
        )
        + "\n"
    )
    say(f"wrote {path}")
    return all(r.met for r in rows)


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.async_jobs", __doc__)
    p.add_argument("--jobs", type=positive, default=10_000, help="jobs per run (%(default)s)")
    p.add_argument("--sleep", type=positive_float, default=0.05, help="each job's await, s")
    p.add_argument("--rounds", type=positive, default=3, help="runs per contender (%(default)s)")
    p.add_argument(
        "--peers",
        type=lambda t: [] if t == "none" else t.split(","),
        default=["procrastinate", "pgqueuer"],
        help="peers to run, comma-separated, or none (default: procrastinate,pgqueuer)",
    )
    p.add_argument("--timeout", type=positive_float, default=300.0, help="per run, s")
    p.add_argument(
        "--quiet-wait",
        type=non_negative_float,
        default=10.0,
        help="seconds to wait for others to go quiet before each run (0: not at all)",
    )
    p.add_argument("--json", type=Path, default=None, help=f"results file ({RESULTS})")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    unknown = set(args.peers) - {"procrastinate", "pgqueuer"}
    if unknown:
        raise SystemExit(f"unknown peers: {', '.join(sorted(unknown))}")
    python = _peers_env.ensure() if args.peers else None
    meta: dict[str, Any] = {
        "environment": f"load average {load_average()} at start",
        "jobs": args.jobs,
        "sleep": args.sleep,
        "rounds": args.rounds,
        "at": time.strftime("%Y-%m-%d %H:%M:%S"),
        "versions": _peers_env.versions(python) if python is not None else {},
    }
    return 0 if report(args, measure(args, python), meta) else 1


if __name__ == "__main__":
    sys.exit(main())
