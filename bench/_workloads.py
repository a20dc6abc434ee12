"""bench.compare's workloads: each one measures one contender once, into `Metric`s.

`Comparison.run` goes round by round, and in each round through every contender in turn
(the order rotated by one each round, so that none always runs first, on a cold cache,
or last, on a warm one), then measures the workload's reference in the same round: the
PostgreSQL limit of forklift's statements for the drain, the bare floor for latency,
multiprocessing.Pool for the CPU-bound jobs.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from bench import pg_limit
from bench._contenders import WORKERS, Contender, Floor, Forklift
from bench._harness import percentile, say
from bench._results import Metric
from bench.cpu import calibrate
from bench.cpu_app import spin

WORKLOADS = ("enqueue", "drain", "effect", "limit", "latency", "cpu", "recovery", "backlog")
EXTRA = ("sweep",)  # run only when asked for with --only
# forklift's 2 workers each claim on one connection and complete on another.
LIMIT_CONNECTIONS = 2 * WORKERS
# The batched limit's claim: what a prefetching worker claims of no-ops at a time is
# tens of jobs, up to its cap of 256; 128 is the middle of that, whatever the "best"
# concurrency is.
LIMIT_BATCH = 128
SWEEPS = {
    "forklift": (1, 4, 16, 64, 128),
    "pgqueuer": (10, 50, 100, 200, 500),
    "procrastinate": (1, 25, 50, 100, 200, 500),
    "celery": (4, 16, 64, 128),
}


@dataclass
class Plan:
    """The sizes of every workload (bench.compare's flags; --quick shrinks them)."""

    jobs: int = 20_000
    batch: int = 10_000
    one_by_one: int = 1_000
    latency_jobs: int = 500
    latency_rate: float = 200.0
    cpu_jobs: int = 200
    job_ms: float = 50.0
    nap: float = 5.0
    recovery_timeout: float = 90.0
    backlog_small: int = 10_000
    backlog_large: int = 1_000_000
    backlog_measure: int = 10_000
    backlog_peers: bool = False
    effect_jobs: int = 10_000
    # forklift's --concurrency for jobs with an effect: its default, then where the
    # commits of a worker's threads start sharing WAL flushes
    effect_concurrency: tuple[int, ...] = (1, 8, 32)


class Comparison:
    """The metrics, filled round by round; `settings` says how each contender ran."""

    def __init__(self, plan: Plan, contenders: Sequence[Contender], floor: Floor | None) -> None:
        self.plan = plan
        self.contenders = list(contenders)
        self.forklift = next(c for c in contenders if isinstance(c, Forklift))
        self.floor = floor
        self.metrics: dict[str, Metric] = {}
        self.settings: dict[str, dict[str, str]] = {}
        self.iterations = 0  # spin() iterations of one CPU job, calibrated once
        self.gave_up: set[tuple[str, str]] = set()  # (workload, contender) not repeated

    def metric(
        self, key: str, label: str, unit: str, higher: bool, ref: str | None = None
    ) -> Metric:
        if key not in self.metrics:
            self.metrics[key] = Metric(key, label, unit, higher, reference=ref)
        return self.metrics[key]

    def note(self, who: str, workload: str, text: str) -> None:
        self.settings.setdefault(who, {})[workload] = text

    def run(self, workloads: Sequence[str], rounds: int) -> None:
        for workload in workloads:
            measure: Callable[[Contender], None] = getattr(self, workload)
            for r in range(rounds):
                for c in self.turns(workload, r):
                    say(f"{workload}, round {r + 1}/{rounds}: {c.name} ...")
                    measure(c)
                self.reference(workload)

    def turns(self, workload: str, round_: int) -> list[Contender]:
        """Who measures `workload` in this round, in which order (rotated each round)."""
        if workload in ("limit", "effect") or (
            workload == "backlog" and not self.plan.backlog_peers
        ):
            return [self.forklift]
        shift = round_ % len(self.contenders)
        order = self.contenders[shift:] + self.contenders[:shift]
        return [c for c in order if (workload, c.name) not in self.gave_up]

    def reference(self, workload: str) -> None:
        if workload == "latency" and self.floor is not None:
            say("latency: the bare floor ...")
            self.latency(self.floor)
        elif workload == "cpu":
            say(f"cpu: multiprocessing.Pool({WORKERS}) ...")
            seconds = pool_from_spawn(self.plan.cpu_jobs, self.iterations, WORKERS)
            self.cpu_metric().add(f"Pool({WORKERS})", seconds)

    # -- the workloads --------------------------------------------------------------------

    def enqueue(self, c: Contender) -> None:
        p = self.plan
        bulk = self.metric(
            "enqueue.bulk", f"enqueue {p.jobs:,} in bulk (batches of {p.batch:,})", "jobs/s", True
        )
        c.reset()
        bulk.add(c.name, p.jobs / c.enqueue_bulk(p.jobs, p.batch))
        one = self.metric("enqueue.one", f"enqueue {p.one_by_one:,} one by one", "jobs/s", True)
        c.reset()
        one.add(c.name, p.one_by_one / c.enqueue_one_by_one(p.one_by_one))
        c.reset()
        say(
            f"  {c.name}: bulk {bulk.values[c.name][-1]:,.0f}/s, one by one "
            f"{one.values[c.name][-1]:,.0f}/s"
        )

    def drain(self, c: Contender) -> None:
        for label, setting in c.drain_settings().items():
            why = f" ({setting.why})" if setting.why else ""
            self.note(c.name, f"drain, {label}", setting.command + why)
            result = c.drain(self.plan.jobs, setting, self.plan.batch)
            self.drain_metric(label, "wall").add(c.name, result.rate)
            self.drain_metric(label, "steady").add(c.name, result.steady_rate)
            say(
                f"  {c.name} {label}: {result.rate:,.0f}/s from spawn, "
                f"{result.steady_rate or 0:,.0f}/s at 10-90%"
            )
        c.reset()

    def drain_metric(self, label: str, kind: str) -> Metric:
        what = "from spawn" if kind == "wall" else "10-90%"
        return self.metric(
            f"drain.{label}.{kind}",
            f"drain {self.plan.jobs:,} no-ops, {label}: {what}",
            "jobs/s",
            True,
            "PG limit" if kind == "steady" else None,
        )

    def effect(self, c: Contender) -> None:
        """Jobs with an effect: one INSERT in `ctx.transaction()` each, committed with the
        job's completion (forklift's turn only: the peers have no transaction that commits
        a handler's writes with its completion). At concurrency 1 each worker waits for
        one WAL flush per job; more threads per worker share flushes."""
        f = self.forklift
        n = self.plan.effect_jobs
        for concurrency in self.plan.effect_concurrency:
            label = "defaults" if concurrency == 1 else f"--concurrency {concurrency}"
            extra = () if concurrency == 1 else ("--concurrency", str(concurrency))
            f.setting = f.run_setting(label, WORKERS, *extra)
            self.note(f.name, f"effect, {label}", f.setting.command)
            f.fill_with("latency", n, self.plan.batch)
            result = f.process(n, WORKERS, concurrency)
            self.metric(
                f"effect.{concurrency}",
                f"drain {n:,} jobs with an effect (one INSERT each), {label}: 10-90%",
                "jobs/s",
                True,
            ).add(f.name, result.steady_rate)
            say(f"  {f.name} {label}: {result.steady_rate or 0:,.0f}/s at 10-90%")
        f.reset()

    def limit(self, c: Contender) -> None:
        """PostgreSQL's limit for forklift's claim + complete (forklift's turn only)."""
        f = self.forklift
        for label, batch in (("defaults", 1), ("best", LIMIT_BATCH)):
            f.fill(self.plan.jobs, self.plan.batch)
            seconds, done = pg_limit.drain(f.dsn, f.schema, batch, LIMIT_CONNECTIONS)
            if done != self.plan.jobs:
                raise RuntimeError(f"the PG limit loops completed {done}/{self.plan.jobs} jobs")
            self.drain_metric(label, "steady").add("PG limit", self.plan.jobs / seconds)
            say(f"  PG limit, batches of {batch}: {self.plan.jobs / seconds:,.0f} jobs/s")
        self.note(
            "PG limit",
            "drain",
            f"bench/pg_limit.py: {LIMIT_CONNECTIONS} connections, each claim+complete of 1 "
            f"(defaults row) or {LIMIT_BATCH} (best row) jobs per round trip, no Python work",
        )
        f.reset()

    def latency(self, c: Contender) -> None:
        p = self.plan
        ms = c.start_latency(p.latency_jobs, p.latency_rate)
        ref = "bare floor"
        label = f"latency, {p.latency_jobs} jobs at {p.latency_rate:g}/s"
        self.metric("latency.p50", f"{label}: p50", "ms", False, ref).add(
            c.name, percentile(ms, 50)
        )
        self.metric("latency.p99", f"{label}: p99", "ms", False, ref).add(
            c.name, percentile(ms, 99)
        )
        assert c.setting is not None
        self.note(c.name, "latency", c.setting.command)
        say(f"  {c.name}: p50 {percentile(ms, 50):.2f} ms, p99 {percentile(ms, 99):.2f} ms")

    def cpu_metric(self) -> Metric:
        p = self.plan
        label = f"{p.cpu_jobs} CPU jobs x {p.job_ms:g} ms, wall from spawn"
        return self.metric("cpu.wall", label, "s", False, f"Pool({WORKERS})")

    def cpu(self, c: Contender) -> None:
        if not self.iterations:
            self.iterations = calibrate(self.plan.job_ms / 1000, 7)
            say(f"  calibrated: spin({self.iterations:,}) takes ~{self.plan.job_ms:g} ms here")
        seconds = c.cpu(self.plan.cpu_jobs, self.iterations)
        self.cpu_metric().add(c.name, seconds)
        self.note(
            c.name,
            "cpu",
            "forklift run --workers 2" if c is self.forklift else c.setting_for("cpu").command,
        )
        say(f"  {c.name}: {seconds:.2f} s")

    def recovery(self, c: Contender) -> None:
        p = self.plan
        rerun = c.recovery(p.nap, p.recovery_timeout)
        label = "SIGKILL of the busy worker -> its job running again"
        metric = self.metric("recovery", label, "s", False)
        metric.missing = "never"
        metric.add(c.name, rerun)
        self.note(
            c.name,
            "recovery",
            "forklift run --workers 2 (bench.restart)"
            if c is self.forklift
            else c.setting_for("recovery").command,
        )
        if rerun is None:
            say(f"  {c.name}: not running again within {p.recovery_timeout:g} s; not repeated")
            self.gave_up.add(("recovery", c.name))
        else:
            say(f"  {c.name}: running again after {rerun:.3f} s")

    def backlog(self, c: Contender) -> None:
        p = self.plan
        setting = c.drain_settings()["best"]
        rates = {}
        for ready in (p.backlog_small, p.backlog_large):
            say(f"  {c.name}: {ready:,} ready jobs, draining the first {p.backlog_measure:,} ...")
            c.setting = setting
            c.fill(ready, 50_000)
            result = c.process(p.backlog_measure, WORKERS, 0)
            rates[ready] = result.steady_rate or result.rate
            label = f"drain rate, first {p.backlog_measure:,} of {ready:,} ready (best)"
            self.metric(f"backlog.{ready}", label, "jobs/s", True).add(c.name, rates[ready])
        ratio = rates[p.backlog_large] / rates[p.backlog_small]
        label = f"rate with {p.backlog_large:,} / with {p.backlog_small:,} ready"
        self.metric("backlog.ratio", label, "x", True).add(c.name, ratio)
        c.reset()

    def sweep(self, c: Contender) -> None:
        for value in SWEEPS[c.name]:
            setting = c.sweep_setting(value)
            result = c.drain(self.plan.jobs, setting, self.plan.batch)
            label = f"sweep {c.name} {setting.label}: 10-90%"
            self.metric(f"sweep.{c.name}.{value}", label, "jobs/s", True).add(
                c.name, result.steady_rate
            )
            say(f"  {setting.command}: {result.steady_rate or 0:,.0f}/s at 10-90%")
        c.reset()


def pool_from_spawn(jobs: int, iterations: int, processes: int) -> float:
    """Seconds for multiprocessing.Pool(processes) to run `jobs` spin calls, from its spawn
    (bench.cpu's run_pool starts the clock after a warm-up; here, as for the job queues,
    the clock starts before the pool's processes do)."""
    started = time.perf_counter()
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        pool.map(spin, [iterations] * jobs, chunksize=1)
    return time.perf_counter() - started
