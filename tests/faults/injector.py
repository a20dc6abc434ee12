"""The fault driver: each kind of fault the runs inject, and how long work took to resume.

`Injector.inject(fault)` does the harm and undoes it where the world would (the database
comes back, the network heals, systemd starts a fresh supervisor), then returns an
`Injection`: when it was done, when it was over, and whether /readyz said 503 while
the database was away. `Injector.recovery()` measures the seconds from "over" to the
next job that succeeded (the workload keeps a backlog, so work is always due).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import psycopg

from forklift.embedded import Cluster
from forklift.testing import WaitTimedOut, wait_for
from tests.acceptance.proxy import Proxy
from tests.faults.harness import Fleet, Workload


class Fault(StrEnum):
    KILL_WORKER = "kill worker"  # SIGKILL one worker process
    FREEZE_WORKER = "freeze worker"  # SIGSTOP one worker past its lease, then SIGCONT
    TERMINATE = "terminate backends"  # pg_terminate_backend on every forklift session
    DB_RESTART = "db restart"  # pg_ctl restart, fast or immediate (a crash)
    DB_OUTAGE = "db down"  # the server stopped for `outage` seconds
    KILL_SUPERVISOR = "kill supervisor"  # SIGKILL of the supervisor alone; systemd restarts it
    KILL_GROUP = "kill group"  # SIGKILL of its whole process group; systemd restarts it
    SIGTERM = "sigterm"  # a deploy: graceful stop mid-job, a fresh supervisor
    TCP_CUT = "tcp cut"  # every connection broken, new ones refused, for `blip` seconds
    TCP_STALL = "tcp stall"  # no byte carried either way for `blip` seconds


@dataclass
class Injection:
    fault: Fault
    started: float  # monotonic
    over: float = 0.0  # when the world undid it (database up, network healed, restarted)
    readyz_503: bool | None = None  # for database outages: seen not ready meanwhile
    detail: str = ""


@dataclass
class Injector:
    """Injects faults into a fleet serving a workload on a cluster behind a proxy."""

    cluster: Cluster
    proxy: Proxy
    fleet: Fleet
    workload: Workload
    lease: float = 3.0  # the fleet's --lease: a freeze lasts past it
    outage: float = 20.0  # seconds the database stays down
    blip: float = 2.0  # seconds a TCP cut or stall lasts
    rng: random.Random = field(default_factory=random.Random)

    def inject(self, fault: Fault) -> Injection:
        injection = Injection(fault, time.monotonic())
        getattr(self, "_" + fault.name.lower())(injection)
        injection.over = injection.over or time.monotonic()
        return injection

    def recovery(self, since: float, timeout: float = 60.0) -> float | None:
        """Seconds from `since` (monotonic, the fault's end) until one more job succeeded;
        None if none did within `timeout`."""
        before = self.workload.succeeded()

        def resumed() -> bool:
            # Or nothing is left to succeed (poisoned jobs only die): nothing held up.
            return self.workload.succeeded() > before or self.workload.unfinished("work") == 0

        try:
            wait_for(resumed, timeout, 0.01)
        except WaitTimedOut:
            return None
        return time.monotonic() - since

    # -- processes ---------------------------------------------------------------------

    def _victim(self) -> int | None:
        workers = self.fleet.workers()
        return self.rng.choice(workers) if workers else None

    def _kill_worker(self, injection: Injection) -> None:
        pid = self._victim()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            injection.detail = f"pid {pid}"

    def _freeze_worker(self, injection: Injection) -> None:
        pid = self._victim()
        if pid is None:
            return
        injection.detail = f"pid {pid}"
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            time.sleep(self.lease * 1.5)
            os.kill(pid, signal.SIGCONT)

    def _supervisor(self) -> Any:
        return self.rng.choice(self.fleet.procs)

    def _kill_supervisor(self, injection: Injection) -> None:
        sup = self._supervisor()
        injection.detail = f"pid {sup.pid}"
        sup.signal(signal.SIGKILL)
        sup.popen.wait(timeout=10)
        self.fleet.replace(sup)  # its orphaned workers drain and exit on their own

    def _kill_group(self, injection: Injection) -> None:
        sup = self._supervisor()
        injection.detail = f"pid {sup.pid}"
        sup.kill_group()
        self.fleet.replace(sup)

    def _sigterm(self, injection: Injection) -> None:
        sup = self._supervisor()
        injection.detail = f"pid {sup.pid}"
        sup.signal(signal.SIGTERM)
        self.fleet.replace(sup)  # the new one starts while the old one drains
        code = sup.wait(timeout=60)
        if code != 0:
            raise AssertionError(f"supervisor {sup.pid} exited {code} on SIGTERM")

    # -- the database ------------------------------------------------------------------

    def _terminate(self, injection: Injection) -> None:
        ended = 0
        with psycopg.connect(self.cluster.dsn, autocommit=True) as db:
            for _ in range(5):
                rows = db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE application_name LIKE 'forklift%' AND pid <> pg_backend_pid()"
                ).fetchall()
                ended += len(rows)
                time.sleep(0.05)
        injection.detail = f"{ended} sessions"

    def _db_restart(self, injection: Injection) -> None:
        mode = self.rng.choice(["fast", "immediate"])
        injection.detail = mode
        self.cluster.restart(mode)  # type: ignore[arg-type]

    def _db_outage(self, injection: Injection) -> None:
        self.cluster.stop("fast")
        deadline = time.monotonic() + self.outage
        seen: dict[int, bool] = {}
        while time.monotonic() < deadline:
            for sup in self.fleet.procs:
                if sup.alive and sup.get("/readyz", timeout=1.0)[0] == 503:
                    seen[sup.pid] = True
            time.sleep(min(0.25, max(0.0, deadline - time.monotonic())))
        injection.readyz_503 = all(seen.get(s.pid) for s in self.fleet.procs if s.alive)
        self.cluster.start()
        injection.over = time.monotonic()  # pg_ctl -w: accepting connections from here

    # -- the network -------------------------------------------------------------------

    def _tcp_cut(self, injection: Injection) -> None:
        self.proxy.cut()
        time.sleep(self.blip)
        self.proxy.restore()

    def _tcp_stall(self, injection: Injection) -> None:
        self.proxy.stall()
        time.sleep(self.blip)
        self.proxy.restore()
