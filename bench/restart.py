"""Restart latency: SIGKILL a worker in the middle of a job; how soon does the job run again?

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.restart
    .venv/bin/python -m bench.restart --kills 20 --workers 4

Starts `python -m forklift run bench.cpu_app:app --workers 1`, then --kills times:

1. waits until every child is older than --settle seconds (1 by default): a child that
   dies before it has booted (connected, ready to claim) is a boot crash to the
   supervisor, whose replacement waits out a restart backoff; a child killed while it
   runs a job is not, and is replaced at once. Settling keeps boot crashes out;
2. enqueues one "nap" job (sleeps --nap 5 s, checking ctx.cancelled every 10 ms); waits
   until it is running (state = 'running' in <schema>.jobs);
3. reads the child's pid from jobs.lease_owner (host:pid:nonce) and SIGKILLs it;
4. polls every 5 ms until the same job is running again with attempts = 2, and until
   /proc/<supervisor>/task/<supervisor>/children lists --workers children again (the
   killed pid reaped, a replacement forked); then lets the job finish.

Reported: kill -> job running again (targets: median <= 0.1 s, max <= 0.3 s), kill ->
the death recorded on the job (state back to 'ready'), the retry delay the supervisor
gave the job (available_at - now at that moment; none for a first crash: the job keeps
its place in line), kill -> the supervisor back at full strength, and which child ran
the second attempt (the replacement or a surviving one).

Everything happens in a fresh schema `bench_<random>` that is dropped at the end (also
on error, Ctrl-C or SIGTERM).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as `python bench/restart.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    CLOCK_TICKS,
    MET,
    Bench,
    ForkliftProcess,
    Row,
    load_average,
    non_negative_float,
    parser,
    positive,
    print_table,
    say,
)
from bench.cpu_app import register
from forklift.testing import wait_for

POLL_INTERVAL = 0.005
TARGET_MEDIAN = 0.1
TARGET_MAX = 0.3


def process_age(pid: int) -> float | None:
    """Seconds since `pid` started (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError):
        return None
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return uptime - int(fields[19]) / CLOCK_TICKS  # field 22: starttime, in clock ticks


# -- the bench ---------------------------------------------------------------------------


@dataclass
class Kill:
    """What followed one SIGKILL (seconds from the kill)."""

    job_id: int
    victim: int
    victim_age: float
    rerun: float  # the job running again, attempts = 2
    recorded: float | None  # the death recorded: the job back to 'ready' (None: not seen)
    retry_delay: float | None  # available_at - now() when it was seen 'ready'
    full_strength: float  # the supervisor back at N live children
    by_replacement: bool  # the second attempt ran in the replacement child


class RestartBench(Bench):
    """The schema, the producer App on it, and the supervisor under test."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "restart")
        self.supervisor: ForkliftProcess | None = None

    def start_supervisor(self, workers: int) -> ForkliftProcess:
        self.supervisor = self.start(
            "run", "bench.cpu_app:app", "--workers", str(workers), "--log-level", "INFO"
        )
        return self.supervisor

    def job(self, job_id: int) -> tuple[str, int, str | None, float | None]:
        """(state, attempts, lease_owner, seconds until available_at) of one job."""
        row = self.db.execute(
            f"SELECT state::text, attempts, lease_owner, "
            f"extract(epoch FROM available_at - now())::float8 "
            f"FROM {self.schema}.jobs WHERE id = %s",
            (job_id,),
        ).fetchone()
        assert row is not None
        return row[0], row[1], row[2], row[3]

    def live_children(self, exclude: int | None = None) -> list[int]:
        """The supervisor's children that are not `exclude` (a killed, unreaped pid)."""
        assert self.supervisor is not None
        return [p for p in self.supervisor.children() if p != exclude]

    def wait_settled(self, workers: int, settle: float, timeout: float = 120.0) -> None:
        """Wait until the supervisor has `workers` children, each older than `settle` s."""
        assert self.supervisor is not None
        # Not wait_for: it sleeps just until the youngest child reaches `settle`, rather
        # than polling at a fixed interval, and gives up early when that is past the deadline.
        deadline = time.monotonic() + timeout
        while True:
            self.supervisor.check_alive()
            kids = self.live_children()
            ages = [process_age(p) for p in kids]
            if len(kids) == workers and all(a is not None for a in ages):
                youngest = min(a for a in ages if a is not None)
                if youngest >= settle:
                    return
                wait = settle - youngest
            else:
                wait = 0.05
            if time.monotonic() + wait > deadline:
                raise RuntimeError(f"no {workers} settled children within {timeout:g} s")
            time.sleep(wait)

    def wait_running(self, job_id: int, attempts: int, timeout: float = 30.0) -> str:
        """Wait until the job runs its `attempts`-th attempt; return its lease owner."""
        supervisor = self.supervisor
        assert supervisor is not None

        def running() -> str | None:
            supervisor.check_alive()
            state, tries, owner, _ = self.job(job_id)
            return owner if state == "running" and tries == attempts else None

        what = f"job {job_id} to run its attempt {attempts}"
        owner: str = wait_for(running, timeout, POLL_INTERVAL, what)
        return owner

    def kill_once(self, nap: float, workers: int, timeout: float = 30.0) -> Kill:
        """Enqueue a nap, SIGKILL the child running it, time what follows."""
        job_id = self.app.enqueue("nap", {"seconds": nap})
        owner = self.wait_running(job_id, 1)
        victim = int(owner.rsplit(":", 2)[1])  # host:pid:nonce
        survivors = set(self.live_children(exclude=victim))
        if victim not in self.live_children():
            raise RuntimeError(f"lease owner {owner} is not a child of the supervisor")
        victim_age = process_age(victim) or 0.0
        killed = time.perf_counter()
        os.kill(victim, signal.SIGKILL)
        recorded = retry_delay = rerun = full = None
        by_replacement = False
        state, attempts = "running", 1
        # Not wait_for: one loop, every 5 ms, times three events from the kill (the death
        # recorded, the job running again, the supervisor at full strength).
        while rerun is None or full is None:
            now = time.perf_counter() - killed
            if rerun is None:
                state, attempts, rerun_owner, due_in = self.job(job_id)
                if recorded is None and state == "ready":
                    recorded, retry_delay = now, max(0.0, due_in or 0.0)
                if state == "running" and attempts == 2 and rerun_owner:
                    rerun = now
                    by_replacement = int(rerun_owner.rsplit(":", 2)[1]) not in survivors
                elif state not in ("running", "ready"):
                    raise RuntimeError(f"job {job_id} went {state} (attempts {attempts})")
            if full is None and len(self.live_children(exclude=victim)) == workers:
                full = now
            if now > timeout:
                raise RuntimeError(
                    f"after {timeout:g} s: job {job_id} {state} attempt {attempts}, "
                    f"{len(self.live_children(exclude=victim))} children"
                )
            time.sleep(POLL_INTERVAL)
        self.wait_done(job_id, nap + 30.0)
        return Kill(job_id, victim, victim_age, rerun, recorded, retry_delay, full, by_replacement)

    def wait_done(self, job_id: int, timeout: float) -> None:
        """Wait until the job has succeeded; raise at once if it went anywhere else."""
        supervisor = self.supervisor
        assert supervisor is not None

        def succeeded() -> bool:
            supervisor.check_alive()
            state = self.job(job_id)[0]
            if state not in ("running", "ready", "succeeded"):
                raise RuntimeError(f"job {job_id} is {state}, expected it to succeed")
            return state == "succeeded"

        wait_for(succeeded, timeout, 0.05, f"job {job_id} to succeed")


# -- command line ------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.restart", __doc__)
    p.add_argument("--kills", type=positive, default=10, help="kills to time (%(default)s)")
    p.add_argument(
        "--workers", type=positive, default=1, help="forklift run --workers (%(default)s)"
    )
    p.add_argument(
        "--settle",
        type=non_negative_float,
        default=1.0,
        help="before each kill, wait until every child is this old, in seconds: a child "
        "killed before it has booted is a boot crash, whose replacement waits out the "
        "supervisor's restart backoff (%(default)s)",
    )
    p.add_argument(
        "--nap",
        type=non_negative_float,
        default=5.0,
        help="seconds the killed job sleeps, checking ctx.cancelled every 10 ms (%(default)s)",
    )
    return p


def spread(values: Sequence[float]) -> str:
    return f"median {statistics.median(values):.3f} s, max {max(values):.3f} s"


def report(args: argparse.Namespace, kills: list[Kill], log: str) -> tuple[list[Row], str]:
    rerun = [k.rerun for k in kills]
    median = statistics.median(rerun)
    recorded = [k.recorded for k in kills if k.recorded is not None]
    delays = [k.retry_delay for k in kills if k.retry_delay is not None]
    replaced = sum(k.by_replacement for k in kills)
    backoffs = sum("child.restart_backoff" in line for line in log.splitlines())
    rows = [
        Row(
            "kill -> same job running again (attempts = 2)",
            spread(rerun),
            f"median <= {TARGET_MEDIAN:g} s, max <= {TARGET_MAX:g} s",
            median <= TARGET_MEDIAN and max(rerun) <= TARGET_MAX,
        ),
        Row(
            "kill -> death recorded (job 'ready' again)",
            spread(recorded) if recorded else "not seen",
        ),
        Row(
            "  retry delay the supervisor gave the job",
            spread(delays) if delays else "not seen",
        ),
        Row(
            f"kill -> supervisor at {args.workers} live children again",
            spread([k.full_strength for k in kills]),
        ),
        Row(
            "2nd attempt ran in: replacement / surviving child",
            f"{replaced} / {len(kills) - replaced}",
        ),
        Row("restart backoffs the supervisor logged", str(backoffs)),
        Row(
            "age of the killed children",
            f"min {min(k.victim_age for k in kills):.1f} s",
        ),
    ]
    lines = [
        f"  kill {i + 1:2}: job {k.job_id} pid {k.victim} (age {k.victim_age:.1f} s): "
        f"recorded {k.recorded if k.recorded is None else f'{k.recorded:.3f}'} s, "
        f"rerun {k.rerun:.3f} s in the {'replacement' if k.by_replacement else 'survivor'}, "
        f"{args.workers} children at {k.full_strength:.3f} s"
        for i, k in enumerate(kills)
    ]
    return rows, "\n".join(lines)


def is_problem(line: str) -> bool:
    """A log line at WARNING or above (plain or JSON log format), or a traceback."""
    text = line.lower()
    return any(
        mark in text
        for mark in (" warning ", " error ", '"level": "warning"', '"level": "error"', "traceback")
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    load_start = load_average()
    kills: list[Kill] = []
    with RestartBench(args.dsn).session() as bench:
        supervisor = bench.start_supervisor(args.workers)
        for i in range(args.kills):
            bench.wait_settled(args.workers, args.settle)
            kill = bench.kill_once(args.nap, args.workers)
            kills.append(kill)
            say(
                f"kill {i + 1}/{args.kills}: pid {kill.victim}; job running again after "
                f"{kill.rerun:.3f} s, {args.workers} children after {kill.full_strength:.3f} s"
            )
        code = supervisor.stop()
        bad = bench.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE state <> 'succeeded' OR attempts <> 2"
        )
        if bad:
            raise RuntimeError(f"{bad} nap jobs did not succeed at their 2nd attempt")
    log = supervisor.output()
    rows, details = report(args, kills, log)
    rows.append(Row("supervisor exit code after SIGTERM", str(code), "0", code == 0))
    note = (
        f"bench.restart: forklift run --workers {args.workers}, {args.kills} SIGKILLs of the "
        f"child running a {args.nap:g} s job, children settled {args.settle:g} s before each; "
        f"polled every {POLL_INTERVAL * 1000:g} ms; {os.cpu_count()} CPUs, load "
        f"average {load_start} at start, {load_average()} at end"
    )
    print_table(rows, note, MET)
    print(details)
    problems = [
        line
        for line in log.splitlines()
        if is_problem(line)
        and not any(e in line for e in ("child.exited", "job.failed", "child.restart_backoff"))
    ]
    if problems:
        print(f"forklift logged {len(problems)} other warning/error line(s):")
        for line in problems[-30:]:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
