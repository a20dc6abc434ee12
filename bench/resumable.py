"""Resumable jobs: the work a fault makes a job do again, with and without checkpoints,
and what checkpointing costs.

Run it from the repository root with the project's interpreter:

    .venv/bin/python -m bench.resumable            # ~4 minutes
    .venv/bin/python -m bench.resumable --quick    # ~1 minute: 3 faults of each kind

Everything runs in a fresh database `bench_resumable_<random>` on the server of --dsn
(so that "every session" below means this run's sessions only), dropped at the end.

1. Work redone after K faults (K = 1, 3, 10; --kills). For each kind of fault, one
   `forklift run bench.resumable_app:app` (--grace 1, --no-prefetch) runs two copies of
   one CPU job side by side: --items bodies of --item-ms of pure-Python CPU work each,
   one looping through `ctx.iterate` (for the "past grace" fault, `ctx.checkpoint(next
   item)` after each body, deaf to the stop), the other a plain `for` from item 0 on
   every attempt, which is what a queue without checkpoints gives a job (forklift
   before them, Celery, RQ, pgqueuer). Each body records its item and CPU seconds in a
   table as it ends, so the job itself says what it did twice. When both jobs have run
   a pause since they last resumed (uniform in --pause, the same series for every
   kind), the fault hits both at once:

   - kill        SIGKILL of the worker child running each job;
   - term        SIGTERM of the supervisor (a deploy), a fresh one started once it has
                 exited: ctx.iterate ends at its next item, checkpointed, released;
   - past grace  the same, but the handler ignores the stop: released past --grace,
                 its last ctx.checkpoint written with the release;
   - freeze      SIGSTOP of each job's child until another child has taken the job
                 over (its --lease of 2 s expired), then SIGCONT;
   - terminate   pg_terminate_backend of every session of this run's database.

   A job whose worker died is given a retry delay by its supervisor (0.5 s, doubling
   with each attempt, up to a minute: a job that kills its worker must not kill the
   next one at once). It changes the wall time of a run, not the work redone, so after
   each kill the bench makes the jobs due at once (and prints the delays it cut short).
   Once the last fault's work has been done again, the supervisor is stopped and the
   bodies counted: redone = bodies - distinct items (CPU seconds: the bodies' own),
   each redone body charged to the fault that ended its run. The checkpointing job's
   target is K x (the checkpoint interval, 1 s, + one item); a body cut short by a
   fault is in neither column (at most an item per fault, in both).
2. Overhead: one job on `--workers 1` burns items of --burn-item-ms (calibrated in the
   job) for about twice --burn-seconds, in rounds of four 20 ms segments, two of which
   (ABBA, then BAAB) call `ctx.checkpoint(next item)` after every item. Per round, the wall
   seconds of the segments with checkpoints over those without, measured in the
   handler; the median round's ratio is what the calls cost. (Whole 20 s runs, or half
   second segments, differ by several per cent with no checkpoint in either on this
   VM, whose speed moves from one half second to the next: 20 ms segments see the same
   machine.) The checkpoints are written by the worker's progress writer every second,
   on a thread of its own, whose CPU seconds meanwhile (from /proc) are added, all of
   them, as a share of the job's wall: the two together are the overhead (target: <= 1
   %). Beside it, one ctx.checkpoint() call's cost, timed in this process on a
   JobContext of a real job.
3. `ctx.iterate(range(n))` against a plain `for` over the same range, n = --loop-items,
   both with empty bodies, timed alternately in one real job on a worker (its progress
   writer running): microseconds per item (target: <= 1 us per item above the plain
   loop).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/resumable.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import (
    MET,
    Bench,
    ForkliftProcess,
    Row,
    fresh_database,
    load_average,
    parser,
    positive,
    positive_float,
    print_grid,
    print_table,
    say,
)
from bench.cpu import calibrate
from bench.resumable_app import create_tables, register
from forklift._ids import owner_process
from forklift.store import ClaimedJob
from forklift.testing import WaitTimedOut, wait_for
from forklift.workers.checkpoints import EVERY as CHECKPOINT_EVERY
from forklift.workers.context import JobContext

APP = "bench.resumable_app:app"
KS = (1, 3, 10)  # faults after which the redone work is reported
GRACE = "1"  # forklift run --grace: a plain job under SIGTERM is released this long after
LEASE = "2"  # forklift run --lease for the freeze
# A job made due by the bench (not by an insert, which notifies the workers) is claimed
# within the workers' poll interval.
FAST_POLL = ("--poll-interval", "0.1")
WAIT = 60.0  # seconds any one step may take before the bench gives up
TARGET_OVERHEAD = 0.01
TARGET_PER_ITEM = 1e-6


@dataclass(frozen=True)
class Fault:
    """One kind of fault: how the checkpointing job loops (resumable_app's `how`) and
    the supervisor's flags."""

    name: str
    title: str
    how: str
    flags: tuple[str, ...] = ("--workers", "2")


FAULTS = (
    Fault("kill", "SIGKILL of the worker child", "iterate", ("--workers", "2", *FAST_POLL)),
    Fault("term", "SIGTERM, ctx.iterate ends at its next item", "iterate"),
    Fault("past grace", "SIGTERM past --grace, the handler deaf to it", "checkpoint"),
    Fault(
        "freeze",
        f"SIGSTOP of the child past its {LEASE} s lease",
        "iterate",
        ("--workers", "4", "--lease", LEASE),
    ),
    Fault("terminate", "pg_terminate_backend of every session", "iterate"),
)


@dataclass(frozen=True)
class Body:
    """One item's body as the job recorded it."""

    run: str
    item: int
    cpu: float
    at: datetime
    n: int  # the order the bodies were recorded in


@dataclass
class Redone:
    """What a job did again, per fault (index k: the runs that fault k ended)."""

    items: list[int]
    seconds: list[float]
    item_cpu: float  # the median body's CPU seconds

    def after(self, k: int) -> tuple[int, float]:
        """Items and CPU seconds redone after the first `k` faults."""
        return sum(self.items[:k]), sum(self.seconds[:k])


def redone(bodies: Sequence[Body], faults: Sequence[datetime]) -> Redone:
    """Charge each body whose item a later run did again to the fault that ended its run
    (the first fault after the run's first body). Their sum is bodies - distinct items."""
    runs: dict[str, list[Body]] = {}
    for body in sorted(bodies, key=lambda b: b.n):
        runs.setdefault(body.run, []).append(body)
    ordered = list(runs.values())  # by each run's first body
    items, seconds = [0] * len(faults), [0.0] * len(faults)
    for i, run in enumerate(ordered):
        later = {b.item for other in ordered[i + 1 :] for b in other}
        k = sum(at < run[0].at for at in faults)  # faults before the run began
        if k >= len(faults):
            continue  # the last run: nothing ended it
        again = [b for b in run if b.item in later]
        items[k] += len(again)
        seconds[k] += sum(b.cpu for b in again)
    cpu = statistics.median(b.cpu for b in bodies) if bodies else 0.0
    return Redone(items, seconds, cpu)


@dataclass
class Outcome:
    """One kind of fault's run: what each job redid, and the seconds it took."""

    fault: Fault
    checkpointing: Redone
    plain: Redone
    wall: float
    skipped: list[float]  # the crash retry delays the bench cut short


# -- the bench ---------------------------------------------------------------------------


class ResumableBench(Bench):
    """The schema (with resumable_app's bodies table), its producer, the supervisors."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn, register, "resumable")
        self.supervisor: ForkliftProcess | None = None
        self.flags: tuple[str, ...] = ()
        self.crash_delays: list[float] = []  # the retry delay of each kill's jobs

    def create(self) -> None:
        super().create()
        create_tables(self.app)

    def start_supervisor(self, flags: Sequence[str]) -> ForkliftProcess:
        self.flags = tuple(flags)
        self.supervisor = self.start(
            "run", APP, "--grace", GRACE, "--no-prefetch", "--log-level", "WARNING", *flags
        )
        return self.supervisor

    def stop_supervisor(self) -> None:
        """SIGTERM the supervisor and require a clean exit."""
        sup = self.supervisor
        assert sup is not None
        code = sup.stop(timeout=WAIT)
        if code != 0:
            raise RuntimeError(f"forklift run exited {code}:\n{sup.output()[-3000:]}")

    def result(self, job_id: int, timeout: float) -> Any:
        """The job's result once it succeeded (read from its row: app.result()'s listener
        would outlive the database, which the bench drops)."""

        def ended() -> tuple[str, Any] | None:
            self.check_alive()
            row = self.db.execute(
                f"SELECT state::text, result FROM {self.schema}.jobs WHERE id = %s", (job_id,)
            ).fetchone()
            if row is None or row[0] in ("ready", "running"):
                return None
            return row[0], row[1]

        state, value = wait_for(ended, timeout, 0.05, f"job {job_id} to end")
        if state != "succeeded":
            raise RuntimeError(f"job {job_id} went {state}")
        return value

    def now(self) -> datetime:
        """The database's clock (the bodies' timestamps are on it)."""
        return self.scalar("SELECT clock_timestamp()")  # type: ignore[no-any-return]

    def bodies(self, job_id: int) -> list[Body]:
        rows = self.db.execute(
            f"SELECT run, item, cpu, at, n FROM {self.schema}.bodies WHERE job_id = %s",
            (job_id,),
        ).fetchall()
        return [Body(*row) for row in rows]

    def resumed(
        self, job_ids: Sequence[int], after: datetime | None, *, new_run: bool = True
    ) -> dict[int, datetime]:
        """Wait until each job has recorded a body after `after` (None: any), of a run
        begun since if `new_run` (a run the fault ended may finish a body or more after
        it: during the grace, after a SIGCONT); when each first did."""

        def first_bodies() -> dict[int, datetime] | None:
            self.check_alive()
            rows = self.db.execute(
                f"SELECT job_id, min(at) FROM {self.schema}.bodies AS b "
                "WHERE job_id = ANY(%(jobs)s) AND (%(after)s::timestamptz IS NULL OR "
                "at > %(after)s AND NOT (%(new)s AND EXISTS (SELECT FROM "
                f"{self.schema}.bodies AS o WHERE o.run = b.run AND o.at <= %(after)s))) "
                "GROUP BY 1",
                {"jobs": list(job_ids), "after": after, "new": new_run},
            ).fetchall()
            return dict(rows) if len(rows) == len(job_ids) else None

        try:
            found: dict[int, datetime] = wait_for(first_bodies, WAIT, 0.02, "the jobs to resume")
        except WaitTimedOut:
            raise RuntimeError(f"jobs {list(job_ids)} did not resume: {self.told()}") from None
        return found

    def told(self) -> str:
        """The jobs' rows and the end of the supervisor's log, for an error."""
        rows = self.db.execute(
            f"SELECT id, state, attempts, lease_owner, available_at - now(), last_error "
            f"FROM {self.schema}.jobs"
        ).fetchall()
        log = self.supervisor.output()[-4000:] if self.supervisor is not None else ""
        return f"{rows}\n{log}"

    def caught_up(self, job_id: int) -> bool:
        """Whether the job's latest run has done again every item earlier runs did (or
        the job ended): all it lost is counted."""
        state = self.scalar("SELECT state::text FROM {s}.jobs WHERE id = %s", (job_id,))
        if state != "running":
            if state == "succeeded":
                return True
            if state != "ready":
                raise RuntimeError(f"job {job_id} went {state}")
        runs: dict[str, int] = {}
        for body in sorted(self.bodies(job_id), key=lambda b: b.n):
            runs[body.run] = max(runs.get(body.run, -1), body.item)
        tops = list(runs.values())
        return len(tops) < 2 or tops[-1] >= max(tops[:-1])

    def check_alive(self) -> None:
        if self.supervisor is not None:
            self.supervisor.check_alive()

    # -- the faults ----------------------------------------------------------------------

    def children_of(self, job_ids: Sequence[int]) -> dict[int, int]:
        """{job: the pid of the supervisor's child running it}."""
        assert self.supervisor is not None
        rows = self.db.execute(
            f"SELECT id, lease_owner FROM {self.schema}.jobs "
            "WHERE id = ANY(%s) AND state = 'running'",
            (list(job_ids),),
        ).fetchall()
        pids = {job_id: owner_process(owner)[1] for job_id, owner in rows}
        children = set(self.supervisor.children())
        if len(pids) != len(job_ids) or not set(pids.values()) <= children:
            raise RuntimeError(f"jobs {list(job_ids)} are not all running in children: {pids}")
        return pids

    def inject(self, fault: Fault, job_ids: Sequence[int]) -> None:
        if fault.name == "kill":
            self.kill(job_ids)
        elif fault.name in ("term", "past grace"):
            self.stop_supervisor()
            self.start_supervisor(self.flags)
        elif fault.name == "freeze":
            self.freeze(job_ids)
        else:
            self.scalar(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )

    def kill(self, job_ids: Sequence[int]) -> None:
        """SIGKILL each job's child; once the supervisor has charged the jobs the crash,
        make them due at once (see the module's doc), noting the delay it gave them."""
        killed = set(self.children_of(job_ids).values())
        for pid in killed:
            os.kill(pid, signal.SIGKILL)

        def charged() -> list[float] | None:
            self.check_alive()
            rows = self.db.execute(
                f"SELECT state::text, lease_owner, "
                f"greatest(0, extract(epoch FROM available_at - now()))::float8 "
                f"FROM {self.schema}.jobs WHERE id = ANY(%s)",
                (list(job_ids),),
            ).fetchall()
            if any(owner_process(owner or "")[1] in killed for _, owner, _ in rows):
                return None
            return [delay for state, _, delay in rows if state == "ready"] or [0.0]

        delays: list[float] = wait_for(charged, WAIT, 0.01, "the killed children's jobs charged")
        self.crash_delays.append(max(delays))
        self.db.execute(
            f"UPDATE {self.schema}.jobs SET available_at = now() "
            "WHERE id = ANY(%s) AND state = 'ready' AND available_at > now()",
            (list(job_ids),),
        )

    def freeze(self, job_ids: Sequence[int]) -> None:
        """SIGSTOP each job's child until another child runs the job; then SIGCONT."""
        pids = self.children_of(job_ids)
        owners = {job_id: self.owner(job_id) for job_id in job_ids}
        with self.stopped(list(pids.values())):
            wait_for(
                lambda: all(self.owner(j) not in (None, owners[j]) for j in job_ids),
                WAIT,
                0.02,
                "the frozen children's jobs taken over",
            )

    def owner(self, job_id: int) -> str | None:
        return self.scalar(  # type: ignore[no-any-return]
            "SELECT lease_owner FROM {s}.jobs WHERE id = %s AND state = 'running'", (job_id,)
        )

    @staticmethod
    @contextlib.contextmanager
    def stopped(pids: Sequence[int]) -> Iterator[None]:
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)


# -- 1. work redone ----------------------------------------------------------------------


def run_fault(
    bench: ResumableBench, fault: Fault, pauses: Sequence[float], items: int, iterations: int
) -> Outcome:
    """Both jobs through len(pauses) faults of one kind; what each did again."""
    began = time.monotonic()
    bench.crash_delays.clear()
    bench.start_supervisor(fault.flags)
    args = {"items": items, "iterations": iterations}
    checkpointing = bench.app.enqueue("crunch", {**args, "how": fault.how})
    plain = bench.app.enqueue("crunch", {**args, "how": "plain"})
    jobs = [checkpointing, plain]
    resumed = bench.resumed(jobs, None)
    faults: list[datetime] = []
    for k, pause in enumerate(pauses, 1):
        due = max(resumed.values()).timestamp() + pause
        time.sleep(max(0.0, due - bench.now().timestamp()))
        faults.append(bench.now())
        bench.inject(fault, jobs)
        resumed = bench.resumed(jobs, faults[-1], new_run=fault.name != "terminate")
        say(f"  {fault.name} {k}/{len(pauses)} after {pause:.2f} s: both jobs running again")
    wait_for(lambda: all(bench.caught_up(j) for j in jobs), WAIT, 0.05, "the lost items redone")
    bench.stop_supervisor()
    bench.db.execute(f"DELETE FROM {bench.schema}.jobs WHERE id = ANY(%s)", (jobs,))  # released
    return Outcome(
        fault,
        redone(bench.bodies(checkpointing), faults),
        redone(bench.bodies(plain), faults),
        time.monotonic() - began,
        list(bench.crash_delays),
    )


def redone_grid(outcomes: Sequence[Outcome], kills: int) -> list[list[str]]:
    """The side-by-side table: per fault and K, each job's redone work and the bound."""
    cells = [
        ["fault", "K", "with checkpoints", "bound", "verdict", "without checkpoints"],
    ]
    for o in outcomes:
        item = o.checkpointing.item_cpu
        for k in (k for k in KS if k <= kills):
            n, seconds = o.checkpointing.after(k)
            plain_n, plain_seconds = o.plain.after(k)
            bound = k * (CHECKPOINT_EVERY + item)
            cells.append([
                o.fault.title if k == KS[0] else "",
                str(k),
                f"{seconds:.2f} s ({n} items)",
                f"<= {bound:.2f} s",
                MET.yes if seconds <= bound else MET.no,
                f"{plain_seconds:.2f} s ({plain_n} items)",
            ])  # fmt: skip
    return cells


def per_fault(outcomes: Sequence[Outcome]) -> list[str]:
    """One line per kind of fault: each fault's redone seconds, both jobs."""

    def series(values: Sequence[float]) -> str:
        return " ".join(f"{v:.2f}" for v in values)

    lines = []
    for o in outcomes:
        lines.append(
            f"  {o.fault.name:<10} ({o.wall:3.0f} s)    with: {series(o.checkpointing.seconds)}"
        )
        lines.append(f"  {'':<17} without: {series(o.plain.seconds)}")
        if o.skipped:
            lines.append(f"  {'':<17} crash retry delays cut short: {series(o.skipped)}")
    return lines


# -- 2. overhead, 3. ctx.iterate per item -------------------------------------------------


def overhead(bench: ResumableBench, seconds: float, item: float) -> dict[str, float]:
    """One burn job's result (see resumable_app)."""
    job_id = bench.app.enqueue("burn", {"seconds": seconds, "item": item})
    times: dict[str, float] = bench.result(job_id, timeout=seconds * 4 + WAIT)
    return times


def checkpoint_call(bench: ResumableBench, calls: int = 200_000) -> float:
    """Seconds one ctx.checkpoint() costs the handler, on a real job's context here (its
    write is the progress writer's, on another thread of a worker)."""
    job_id = bench.app.enqueue("loops", {"n": 0, "rounds": 0})
    job = ClaimedJob(job_id, "default", "loops", {}, None, 0, 1, 5, None)
    ctx = JobContext(job, bench.app.store)
    ctx.checkpoint(0)  # the checkpoint read once, as on a first call
    started = time.perf_counter()
    for _ in range(calls):
        pass
    empty = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(calls):
        ctx.checkpoint(i)
    return max(0.0, time.perf_counter() - started - empty) / calls


def loops(bench: ResumableBench, n: int, rounds: int) -> tuple[float, float]:
    """Median seconds per item of a plain for and of ctx.iterate, in a real job."""
    job_id = bench.app.enqueue("loops", {"n": n, "rounds": rounds})
    timed = bench.result(job_id, timeout=WAIT)
    return statistics.median(timed["plain"]) / n, statistics.median(timed["iterate"]) / n


def cost_rows(args: argparse.Namespace, bench: ResumableBench) -> list[Row]:
    """Parts 2 and 3, on one `forklift run --workers 1`."""
    bench.start_supervisor(("--workers", "1"))
    say(f"overhead: {args.burn_seconds:g} s of items with checkpoints, as much without ...")
    cost = overhead(bench, args.burn_seconds, args.burn_item_ms / 1000)
    per_call = checkpoint_call(bench)
    say(f"ctx.iterate over {args.loop_items:,} items ...")
    plain, iterate = loops(bench, args.loop_items, 3)
    bench.stop_supervisor()
    above = iterate - plain
    item = cost["without"] / cost["items"]
    writer = cost["writer"] / (cost["without"] + cost["with"])
    added = cost["added"] + writer
    return [
        Row(
            f"{cost['items']:,.0f} items of {item * 1000:.1f} ms, no checkpoint",
            f"{cost['without']:.2f} s",
        ),
        Row(
            "  the same, ctx.checkpoint() after each (median round)",
            f"{cost['with']:.2f} s ({cost['added']:+.2%})",
        ),
        Row("  the progress writer's CPU, writing them", f"{writer:+.3%} of the wall"),
        Row(
            "  checkpointing every second, in all",
            f"{added:+.2%}",
            f"<= +{TARGET_OVERHEAD:.0%}",
            added <= TARGET_OVERHEAD,
        ),
        Row(
            "  one ctx.checkpoint() call, in a tight loop here",
            f"{per_call * 1e6:.2f} us ({per_call / item:.3%} of an item)",
        ),
        Row(
            f"plain for over {args.loop_items:,} items (median of 3)", f"{plain * 1e6:.3f} us/item"
        ),
        Row(
            "ctx.iterate over the same, in a job on a worker",
            f"{iterate * 1e6:.3f} us/item ({above * 1e6:+.3f})",
            f"<= +{TARGET_PER_ITEM * 1e6:g} us/item",
            above <= TARGET_PER_ITEM,
        ),
    ]


# -- command line ------------------------------------------------------------------------


def pause_range(text: str) -> tuple[float, float]:
    """argparse type: LO,HI seconds, 0 < LO <= HI."""
    lo_text, _, hi_text = text.partition(",")
    lo, hi = positive_float(lo_text), positive_float(hi_text or lo_text)
    if hi < lo:
        raise argparse.ArgumentTypeError(f"{text!r}: LO must be <= HI")
    return lo, hi


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.resumable", __doc__)
    p.add_argument("--quick", action="store_true", help="3 faults of each kind, shorter jobs")
    p.add_argument("--kills", type=positive, help="faults of each kind (10; --quick 3)")
    p.add_argument(
        "--pause",
        type=pause_range,
        help="LO,HI: seconds a job runs after resuming before the next fault, uniform "
        "(1.5,3; --quick 1.5,2.5)",
    )
    p.add_argument("--item-ms", type=positive_float, default=50.0, help="(%(default)s)")
    p.add_argument("--items", type=positive, default=5000, help="per job (%(default)s)")
    p.add_argument("--seed", type=int, default=38, help="of the pauses (%(default)s)")
    p.add_argument("--burn-seconds", type=positive_float, help="overhead job (20; --quick 5)")
    p.add_argument("--burn-item-ms", type=positive_float, default=10.0, help="(%(default)s)")
    p.add_argument("--loop-items", type=positive, default=1_000_000, help="(%(default)s)")
    p.add_argument(
        "--faults",
        default=",".join(f.name for f in FAULTS),
        help="which, comma-separated (%(default)s)",
    )
    return p


def settle_defaults(args: argparse.Namespace) -> None:
    quick = args.quick
    args.kills = args.kills or (3 if quick else 10)
    args.pause = args.pause or ((1.5, 2.5) if quick else (1.5, 3.0))
    args.burn_seconds = args.burn_seconds or (5.0 if quick else 20.0)
    names = {f.name for f in FAULTS}
    args.faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = set(args.faults) - names
    if unknown:
        raise SystemExit(f"unknown --faults {sorted(unknown)}; known: {sorted(names)}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    settle_defaults(args)
    load_start = load_average()
    rng = random.Random(args.seed)
    pauses = [rng.uniform(*args.pause) for _ in range(args.kills)]
    iterations = calibrate(args.item_ms / 1000, 5)
    outcomes: list[Outcome] = []
    with (
        fresh_database(args.dsn, "bench_resumable") as dsn,
        ResumableBench(dsn).session() as bench,
    ):
        for fault in (f for f in FAULTS if f.name in args.faults):
            say(f"{fault.title}: {args.kills} times ...")
            outcomes.append(run_fault(bench, fault, pauses, args.items, iterations))
        costs = cost_rows(args, bench)
    item = statistics.median(o.checkpointing.item_cpu for o in outcomes) if outcomes else 0.0
    note = (
        f"bench.resumable: CPU seconds done twice after K faults, two jobs of {item * 1000:.0f} "
        f"ms items side by side per kind of fault (one checkpointing every "
        f"{CHECKPOINT_EVERY:g} s, one from item 0 each attempt); pauses "
        f"{args.pause[0]:g}-{args.pause[1]:g} s; {os.cpu_count()} CPUs, load average "
        f"{load_start} at start, {load_average()} at end"
    )
    print_grid(note, redone_grid(outcomes, args.kills))
    print("CPU seconds redone by each fault, in order:")
    print("\n".join(per_fault(outcomes)))
    print_table(costs, "bench.resumable: what checkpointing costs", MET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
