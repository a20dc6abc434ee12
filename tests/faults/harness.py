"""What a fault run is made of: the workload's jobs and their invariants, and the fleet of
`forklift run` supervisors that serve them (real CLI, real processes).

`Workload` owns a schema on the cluster: it enqueues jobs of tests.faults.workload, waits
for them and checks, once they are done, what must hold whatever was done to the
processes and the database meanwhile (`Verdict`). `Fleet` starts supervisors, replaces
one that died (as systemd or Kubernetes would) and reads their /readyz.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

import forklift
from forklift.testing import ForkliftProcess, wait_for

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Verdict:
    """What a finished run left in the database."""

    jobs: int
    succeeded: int
    dead: int
    not_finished: list[int]  # neither succeeded nor (deliberately) dead: lost
    wrongly_dead: list[int]  # a job that should have succeeded ended dead
    doubled: list[str]  # keys with more than one effect row
    missing: list[str]  # succeeded, yet no effect row
    over_attempts: list[int]  # claimed more than max_attempts times
    max_attempts_used: int

    @property
    def problems(self) -> list[str]:
        found = []
        if self.not_finished:
            found.append(f"{len(self.not_finished)} jobs never finished: {self.not_finished[:10]}")
        if self.wrongly_dead:
            found.append(f"{len(self.wrongly_dead)} jobs ended dead: {self.wrongly_dead[:10]}")
        if self.doubled:
            found.append(f"{len(self.doubled)} effects committed twice: {self.doubled[:10]}")
        if self.missing:
            found.append(f"{len(self.missing)} succeeded jobs without effect: {self.missing[:10]}")
        if self.over_attempts:
            found.append(f"{len(self.over_attempts)} jobs over max_attempts")
        return found


class Workload:
    """A fresh schema on `dsn` with forklift's tables and an effects table (no unique key)."""

    def __init__(self, dsn: str, schema: str | None = None) -> None:
        self.dsn = dsn
        self.schema = schema or f"f_{secrets.token_hex(5)}"
        self.app = forklift.App(dsn, schema=self.schema)  # producer only: no tasks
        self.poisoned: set[str] = set()

    def create(self) -> None:
        self.app.migrate()
        with self._db() as db:
            db.execute(
                f"CREATE TABLE {self.schema}.effects (key text NOT NULL, job_id bigint,"
                " attempt integer, at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )

    def drop(self) -> None:
        self.app.close()
        with contextlib.suppress(psycopg.Error), self._db() as db:
            db.execute("SET lock_timeout = '10s'")
            db.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")

    @contextlib.contextmanager
    def _db(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            yield conn

    def scalar(self, sql: str, *params: Any) -> Any:
        """The first value of `sql`, in which {s} is the schema; None if the database is away."""
        try:
            with self._db() as db:
                row = db.execute(sql.format(s=self.schema), params).fetchone()
        except psycopg.OperationalError:
            return None
        return None if row is None else row[0]

    # -- jobs ------------------------------------------------------------------------------

    def enqueue(self, n: int, *, spins: int = 20_000, pause: float = 0.0, tag: str = "") -> None:
        # Attempts to spare: a fault costs the jobs it hits one each, and at concurrency
        # above 1 a poisoned job kills the jobs beside it in its worker too.
        tag = tag or secrets.token_hex(3)
        args = {"spins": spins, "pause": pause}
        self.app.enqueue_many(
            [
                forklift.JobSpec(
                    "work", {"key": f"{tag}-{i}", **args}, f"{tag}-{i}", max_attempts=12
                )
                for i in range(n)
            ]
        )

    def enqueue_batch(self, n: int, *, spins: int = 20_000, pause: float = 0.0) -> forklift.Batch:
        """`n` work jobs as one batch (keys b-<i>), its callback `gather` (key gather-<id>:
        one effect row per run of it)."""
        args = {"spins": spins, "pause": pause}
        specs = [
            forklift.JobSpec("work", {"key": f"b-{i}", **args}, max_attempts=12, max_crashes=4)
            for i in range(n)
        ]
        batch = self.app.enqueue_batch(
            specs, on_complete="gather", on_complete_args={"key": "gather"}
        )
        return batch

    def enqueue_poison(self, n: int) -> None:
        """Jobs that kill their worker every time: dead after their 2 attempts."""
        keys = [f"poison-{secrets.token_hex(4)}" for _ in range(n)]
        specs = [forklift.JobSpec("poison", {"key": k}, k, max_attempts=2) for k in keys]
        self.app.enqueue_many(specs)
        self.poisoned.update(keys)

    def succeeded(self) -> int:
        return int(self.scalar("SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'") or 0)

    def unfinished(self, task: str | None = None) -> int | None:
        """Jobs (of `task`, or all) not yet succeeded or dead (None while the database is
        away)."""
        left = self.scalar(
            "SELECT count(*) FROM {s}.jobs WHERE state IN ('ready', 'running')"
            " AND (%s::text IS NULL OR task = %s::text)",
            task,
            task,
        )
        return None if left is None else int(left)

    def wait_finished(self, timeout: float, check: Sequence[ForkliftProcess] = ()) -> None:
        def finished() -> bool:
            for proc in check:
                proc.check_alive()
            return self.unfinished() == 0

        wait_for(finished, timeout, 0.1, "every job to succeed or die")

    def verdict(self) -> Verdict:
        with self._db() as db:
            # A job's effect key: its idempotency key, or (batch jobs carry none) its args'.
            jobs = db.execute(
                f"SELECT id, state::text, attempts, max_attempts, idempotency_key,"
                f" CASE WHEN idempotency_key IS NULL OR idempotency_key LIKE 'forklift:%%'"
                f" THEN args->>'key' END FROM {self.schema}.jobs"
            ).fetchall()
            effects = dict(
                db.execute(f"SELECT key, count(*) FROM {self.schema}.effects GROUP BY key")
            )
        poisoned = self.poisoned
        return Verdict(
            jobs=len(jobs),
            succeeded=sum(1 for j in jobs if j[1] == "succeeded"),
            dead=sum(1 for j in jobs if j[1] == "dead"),
            not_finished=[j[0] for j in jobs if j[1] not in ("succeeded", "dead")],
            wrongly_dead=[j[0] for j in jobs if j[1] == "dead" and j[4] not in poisoned],
            doubled=sorted(k for k, n in effects.items() if n > 1),
            missing=[j[4] for j in jobs if j[1] == "succeeded" and (j[5] or j[4]) not in effects],
            over_attempts=[j[0] for j in jobs if j[2] > j[3]],
            max_attempts_used=max((j[2] for j in jobs), default=0),
        )


# -- supervisors ---------------------------------------------------------------------------


class Supervisor(ForkliftProcess):
    """One `forklift run` of the workload app."""

    def addr(self) -> str:
        found = wait_for(
            lambda: re.search(r"supervisor\.http addr=([\d.]+:\d+)", self.output()),
            timeout=20,
            what="the supervisor's metrics address",
        )
        return f"http://{found[1]}"

    def get(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """(status, body) of GET `path` on its ops server; (0, why) if it does not answer."""
        try:
            with urllib.request.urlopen(self.addr() + path, timeout=timeout) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()
        except OSError as exc:
            return 0, str(exc)

    def ready(self) -> bool:
        return self.get("/readyz")[0] == 200

    def workers(self) -> list[int]:
        return self.children()

    def kill_group(self) -> None:
        """SIGKILL it and its workers at once (node loss, the OOM killer's cgroup kill)."""
        self.kill_session()


@dataclass
class Fleet:
    """The supervisors serving a workload; `replace()` plays systemd for a dead one."""

    env: dict[str, str]
    logdir: Path
    args: list[str]
    procs: list[Supervisor] = field(default_factory=list)
    retired: list[Supervisor] = field(default_factory=list)
    app: str = "tests.faults.workload:app"  # MODULE:APP of `forklift run`

    @classmethod
    def for_workload(
        cls,
        workload: Workload,
        logdir: Path,
        args: Sequence[str],
        dsn: str | None = None,
        app: str = "tests.faults.workload:app",
    ) -> Fleet:
        env = dict(os.environ)
        env.update(
            FORKLIFT_DATABASE_URL=dsn or workload.dsn,
            FORKLIFT_SCHEMA=workload.schema,
            FORKLIFT_METRICS_ADDR="127.0.0.1:0",
            FORKLIFT_LOG_FORMAT="text",
            PYTHONPATH=os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p),
        )
        return cls(env, logdir, list(args), app=app)

    def start(self, n: int = 1) -> list[Supervisor]:
        started = []
        for _ in range(n):
            log = self.logdir / f"supervisor-{len(self.procs) + len(self.retired)}.log"
            proc = Supervisor(["run", self.app, *self.args], self.env, log)
            self.procs.append(proc)
            started.append(proc)
        return started

    def wait_ready(self, timeout: float = 30.0) -> None:
        for proc in self.procs:

            def ready(proc: Supervisor = proc) -> bool:
                proc.check_alive()
                return proc.ready()

            wait_for(ready, timeout, 0.1, f"supervisor {proc.pid} ready")

    def replace(self, proc: Supervisor) -> Supervisor:
        """Start a fresh supervisor in place of `proc`, which is gone."""
        self.procs.remove(proc)
        self.retired.append(proc)
        return self.start()[0]

    def check_alive(self) -> None:
        for proc in self.procs:
            proc.check_alive()

    def workers(self) -> list[int]:
        return [pid for proc in self.procs for pid in proc.workers()]

    def output(self) -> str:
        return "\n".join(p.output() for p in [*self.retired, *self.procs])

    def stop(self, timeout: float = 30.0) -> list[int]:
        """SIGTERM each supervisor and wait; the exit codes."""
        for proc in self.procs:
            proc.signal(signal.SIGTERM)
        return [proc.stop(timeout) for proc in self.procs]

    def kill(self) -> None:
        for proc in [*self.procs, *self.retired]:
            proc.kill_session()


def time_until(condition: Any, timeout: float, interval: float = 0.01, what: str = "") -> float:
    """Seconds until `condition()` held (WaitTimedOut past `timeout`)."""
    started = time.monotonic()
    wait_for(condition, timeout, interval, what)
    return time.monotonic() - started


# A run of a fault-test app (tests/apps/fair.py, tests/apps/unique.py) that is still in
# its window: no end written and no effect committed.
MID_RUN = """
SELECT r.ended IS NULL AND NOT EXISTS (
    SELECT 1 FROM {s}.effects AS e WHERE e.job_id = r.job_id AND e.attempt = r.attempt)
FROM {s}.runs AS r WHERE r.token = %s
"""
# Seconds for a statement the stopped worker had sent to reach its end at the server,
# which is not stopped: a commit in flight lands within it, and is then seen.
SETTLE = 0.1


def stopped_mid_run(workload: Workload, pid: int, run: str) -> bool:
    """SIGSTOP worker `pid` and tell whether its run `run` (`runs.token`) is still in its
    window now that the worker stands still. If it is not (the aim was taken too late: the
    test's own threads may hold it up past the run's end), the worker goes on (SIGCONT)
    and a kill now would miss: the caller aims again."""
    try:
        os.kill(pid, signal.SIGSTOP)
    except ProcessLookupError:
        return False
    time.sleep(SETTLE)
    if workload.scalar(MID_RUN, run):
        return True
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGCONT)
    return False


@dataclass(frozen=True)
class Aim:
    """A kill, and the run it was aimed at (`runs.token`, the test's record of a handler's
    start: that run must not end, and its job must run again)."""

    fault: str
    job_id: int
    run: str


def kill_mid_run(
    workload: Workload, fleet: Fleet, sup: Supervisor, pid: int, run: str, *, group: bool
) -> bool:
    """SIGKILL worker `pid` of `sup` mid-run `run` (stopped_mid_run), or with `group` the
    whole of `sup` (its other workers stopped first, so that none commits during the
    walk of /proc that finds them; a fresh one started as systemd would). False, and
    nothing killed, if the run ended before its worker stood still."""
    if not stopped_mid_run(workload, pid, run):
        return False
    if not group:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return True
    for stopped in (sup.pid, *sup.workers()):
        with contextlib.suppress(ProcessLookupError):
            os.kill(stopped, signal.SIGSTOP)
    sup.kill_group()
    fleet.replace(sup)
    return True
