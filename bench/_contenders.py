"""The contenders of bench.compare on the orchestrator's side: forklift and the bare floor.

A `Contender` is a `bench.throughput.ThroughputBench` (so the timed drain, `process`, and
its 10-90% rate are the very ones of bench.throughput) that starts its workers from a
`Setting` (the commands of one configuration) and adds what bench.compare measures on
top: enqueue-to-start latency with handler-entry stamps (bench._stamps), CPU-bound jobs
and recovery after SIGKILL. The peers' contenders are in bench._peers.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from dataclasses import dataclass

from bench import _stamps, floor
from bench._harness import Command, ForkliftProcess
from bench.compare_app import register_stamp
from bench.cpu import CpuBench
from bench.restart import RestartBench
from bench.throughput import Processing, ThroughputBench
from forklift.testing import wait_for

WORKERS = 2  # worker processes, as many as the machine the README's numbers come from has


@dataclass(frozen=True)
class Setting:
    """One configuration of a contender: how it is started, as a reader would type it."""

    label: str  # "defaults", "best", ...
    command: str  # what the output shows, e.g. "forklift run --workers 2"
    argvs: tuple[tuple[str, ...], ...]  # one per process to start (see Contender.spawn)
    why: str = ""  # where the setting comes from


class Contender(ThroughputBench):
    """The bench's schema and one job queue's workers, in the run's fresh database."""

    name = "?"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.stamps = self.logdir / "stamps"
        self.env[_stamps.ENV] = str(self.stamps)
        self.setting: Setting | None = None

    # -- what a contender says about itself -----------------------------------------------

    def drain_settings(self) -> dict[str, Setting]:
        """The drain's configurations, "defaults" and "best"."""
        raise NotImplementedError

    def sweep_setting(self, value: int) -> Setting:
        """The drain with its main knob at `value` (--sweep)."""
        raise NotImplementedError

    def setting_for(self, purpose: str) -> Setting:
        """The configuration of the "latency", "cpu" or "recovery" workload."""
        raise NotImplementedError

    def spawn(self, argv: tuple[str, ...]) -> ForkliftProcess:
        raise NotImplementedError

    def produce_latency(self, jobs: int, rate: float) -> None:
        raise NotImplementedError

    # -- workers --------------------------------------------------------------------------

    def start_workers(self, count: int, concurrency: int) -> None:
        """Start the processes of the current setting (`count` and `concurrency` are labels)."""
        assert self.setting is not None, "choose a setting first"
        for argv in self.setting.argvs:
            self.spawn(argv)

    def forget(self, pid: int) -> None:
        """A process of ours that was SIGKILLed on purpose: reap it, leave it out of the stop."""
        for proc in [p for p in self.procs if p.pid == pid]:
            proc.wait(10)
            self.procs.remove(proc)

    # -- workloads ------------------------------------------------------------------------

    def drain(self, jobs: int, setting: Setting, batch: int) -> Processing:
        """Enqueue `jobs` no-ops, then time `setting`'s workers from their spawn through them."""
        self.setting = setting
        self.fill(jobs, batch)
        return self.process(jobs, WORKERS, 0)

    def start_latency(self, jobs: int, rate: float) -> list[float]:
        """Enqueue-to-start ms of `jobs` stamp jobs sent at `rate`/s to one idle worker."""
        self.reset()
        self.stamps.unlink(missing_ok=True)
        self.setting = self.setting_for("latency")
        self.start_workers(1, 1)
        try:
            self.produce_latency(jobs, rate)

            def measured() -> list[_stamps.Stamp]:
                self.check_workers_alive()
                found = [s for s in _stamps.read(self.stamps) if not s.key.startswith("warm")]
                return found if len(found) >= jobs else []

            stamps: list[_stamps.Stamp] = wait_for(measured, 60, 0.02, f"{jobs} stamps")
        finally:
            self.stop_workers()
        return [s.latency_ms for s in stamps]

    def cpu(self, jobs: int, iterations: int) -> float:
        """Seconds from spawning the workers until `jobs` burn(iterations) jobs are done."""
        raise NotImplementedError

    def recovery(self, nap: float, timeout: float) -> float | None:
        """Seconds from SIGKILL of the worker running a job until it runs again (None: not
        within `timeout`)."""
        raise NotImplementedError

    def recovery_by_stamps(self, nap: float, timeout: float) -> float | None:
        """`recovery` read from the nap task's stamps: its first start gives the pid to kill."""
        self.reset()
        self.stamps.unlink(missing_ok=True)
        self.setting = self.setting_for("recovery")
        self.start_workers(WORKERS, 1)
        try:
            self.enqueue_nap(nap)
            first = _stamps.wait_key(self.stamps, "nap", 60.0)
            if not first:
                raise RuntimeError("the nap job did not start within 60 s")
            killed = time.time()
            os.kill(first[0].pid, signal.SIGKILL)
            self.forget(first[0].pid)
            again = _stamps.wait_key(self.stamps, "nap", timeout, count=2)
        finally:
            self.stop_workers()
        return again[1].started_at - killed if len(again) > 1 else None

    def enqueue_nap(self, seconds: float) -> None:
        raise NotImplementedError


class Forklift(Contender):
    """forklift itself: `forklift run` (the prefork supervisor) on bench.compare_app."""

    name = "forklift"

    def __init__(self, dsn: str, best_concurrency: int) -> None:
        super().__init__(dsn)
        register_stamp(self.app)
        self.best_concurrency = best_concurrency

    def run_setting(self, label: str, workers: int, *extra: str) -> Setting:
        argv = ("run", "bench.compare_app:app", "--workers", str(workers), *extra)
        return Setting(label, "forklift " + " ".join(argv[:1] + argv[2:]), ((*argv, *QUIET),))

    def drain_settings(self) -> dict[str, Setting]:
        best = self.sweep_setting(self.best_concurrency)
        return {
            "defaults": self.run_setting("defaults", WORKERS),
            "best": Setting("best", best.command, best.argvs, BEST_WHY),
        }

    def sweep_setting(self, value: int) -> Setting:
        return self.run_setting(f"--concurrency {value}", WORKERS, "--concurrency", str(value))

    def setting_for(self, purpose: str) -> Setting:
        assert purpose == "latency", purpose  # cpu and recovery are bench.cpu's and bench.restart's
        return self.run_setting("latency", 1)

    def spawn(self, argv: tuple[str, ...]) -> ForkliftProcess:
        return self.start(*argv)

    def produce_latency(self, jobs: int, rate: float) -> None:
        for key in _stamps.latency_keys(self.stamps, jobs, rate):
            self.app.enqueue("stamp", {"key": key, "t": time.time()})

    def cpu(self, jobs: int, iterations: int) -> float:
        """bench.cpu's run: `forklift run --workers 2`, timed from its spawn."""
        with CpuBench(self.dsn).session() as bench:
            return bench.run_forklift(jobs, iterations, WORKERS).seconds

    def recovery(self, nap: float, timeout: float) -> float | None:
        """bench.restart's kill, of a child that has booted (not a boot crash)."""
        with RestartBench(self.dsn).session() as bench:
            bench.start_supervisor(WORKERS)
            bench.wait_settled(WORKERS, settle=1.0)
            return bench.kill_once(nap, WORKERS, timeout).rerun


QUIET = ("--log-level", "WARNING")
BEST_WHY = (
    "with adaptive prefetch the defaults are as fast as any setting; 4 ~ 1 > 16 > 128 in a "
    "sweep of 40,000 no-ops"
)


class Floor(Contender):
    """The bare floor: INSERT + NOTIFY, LISTEN, one SKIP LOCKED claim; psycopg, no library."""

    name = "bare floor"

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.floor = floor.FloorQueue(self.db, self.schema)

    def create(self) -> None:
        super().create()  # the schema (forklift's tables stay unused)
        self.floor.create()

    def setting_for(self, purpose: str) -> Setting:
        argv = (sys.executable, "-m", "bench.floor", "--dsn", self.dsn, "--schema", self.schema)
        return Setting("latency", "python -m bench.floor", (argv,))

    def spawn(self, argv: tuple[str, ...]) -> ForkliftProcess:
        proc = Command(argv, self.env, self.logdir)
        self.procs.append(proc)
        return proc

    def produce_latency(self, jobs: int, rate: float) -> None:
        for key in _stamps.latency_keys(self.stamps, jobs, rate):
            self.floor.enqueue({"key": key, "t": time.time()})
