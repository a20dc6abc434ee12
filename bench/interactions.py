"""Interaction soak: what users combine, under the faults they meet, in one run; then
one table of what broke.

Run it from the repository root with the project's interpreter (2-3 minutes a run is
plenty to see the defects; it is CPU-light enough for a shared machine):

    .venv/bin/python -m bench.interactions --minutes 2               # the server at --dsn
    .venv/bin/python -m bench.interactions --minutes 2 --embedded    # a private one

Where: against the server at --dsn (127.0.0.1:5432 by default) it works in a database
of its own, created for the run and dropped after it; workers reach it through a TCP
proxy this bench controls (a process of its own). With --embedded it starts a private
PostgreSQL (forklift.embedded.Cluster: initdb in a temporary directory, its own port on
127.0.0.1) that it may stop and start. All traffic stays on 127.0.0.1.

The load, for --minutes (every loop bounded in count and time):
  * two `forklift run` supervisors (--workers each, --concurrency threads a worker,
    --lease 4s) of bench.interactions_app, serving queues default and capped;
  * a feeder: ordinary sync and async jobs by the thousand, a job now and then that
    reports progress with hostile text (NUL, a lone surrogate, bidi overrides), jobs of a
    per-account limited task (Limit(concurrency=1, key="account"), timeout 2 s; one in
    thirty overruns it, some ignore ctx.cancelled) and of a rate-limited one, and a poison
    job (os._exit) every --poison-every seconds;
  * batches with a callback every 3 s (sealed at once, or filled in a `with app.batch()`
    block), their results and their ends waited on by --waiters threads (app.result,
    batch.wait) on the same App;
  * 8 producers (on an App of their own) enqueueing into queue `capped`, held at
    --max-depth (QueueFull; it is paused for the load, so it stays full, and resumed
    for the drain);
  * 3 threads taking turns in `with app.singleton(...)` blocks of 3 s;
  * an operator: `forklift jobs cancel` of a running limited job, `forklift batches
    cancel` of the newest unfinished batch, `forklift jobs purge` of dead, cancelled
    and succeeded jobs, in turn, every --operator-every seconds;
  * faults, one every --fault-every seconds, in a shuffled cycle: SIGKILL of a worker;
    pg_terminate_backend of every session of one kind (workers, supervisors' sessions,
    the producer's pool and waiters, singleton holders); an outage of 2x the lease (the
    embedded server stopped, or the proxy cutting the workers off); and once, at the
    middle of the run, a rolling deploy: one supervisor SIGTERMed and replaced by the
    second app version, which declares the limits differently.

Then it stops the load, waits up to --drain seconds for every job to end, stops the
supervisors and checks, each column from the data it prints under the table:

  effects twice     jobs with more than one effect row (effects: one row per commit,
                    written in ctx.transaction(), no unique key)
  jobs lost         jobs still ready or running after the drain (enqueued, never ended)
  innocent charged  jobs whose error history holds a crash (WorkerDied, WorkerLost,
                    Quarantined) or a LeaseExpired for a run whose handler was not
                    running when it was charged (one that says "not charged", a lost
                    lease forgiven, is none): per the handlers' diary (start and stop
                    lines with pid and time, see bench/interactions_app.py) the charged
                    attempt never started on that pid, or its handler had ended; or a
                    "completion failed" for an attempt whose handler had returned
                    without raising (a hostile progress message in its group commit, a
                    lost connection whose outcome was not reconciled)
  callbacks not 1x  batches whose callback's effect committed other than exactly once
  limit exceeded    handler runs of the per-account task that started while another
                    run of the same account was still in its handler (from the diary's
                    start, beat and stop times, never from claim rows; the limit is the
                    strictest any version declares: 1)
  singleton twice   pairs of `app.singleton` blocks of two threads that both held the
                    lock, overlapping by more than 1 s (a holder may take that long to
                    learn that it lost a dead session's lock)
  slow producer     enqueue calls (any kind, QueueFull included) that took more than 1 s
                    while the database was up (outside an outage and the 3 s after it)

Exit code 1 if any column is not 0, 2 if the run itself could not be made. A JSON row
per run is appended to --results (bench/results/interactions.jsonl).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import logging
import os
import queue
import random
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if not __package__:  # run as `python bench/interactions.py`: the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import psycopg

import forklift
from bench import interactions_app as ia
from bench._harness import (
    REPO_ROOT,
    append_result,
    child_env,
    fresh_database,
    load_average,
    parser,
    positive,
    positive_float,
    print_grid,
    say,
    sigterm_exits,
)
from bench._proxy import ProxyProcess
from forklift._db import redact
from forklift._ids import owner_process
from forklift.batch import Batch
from forklift.embedded import Cluster
from tests.faults.harness import Fleet

LEASE = 4.0  # the supervisors' --lease, seconds
SLOW_CALL = 1.0  # a producer call longer than this on a healthy database is a finding
SETTLE = 3.0  # seconds after an outage during which a producer may still be slow
SINGLETON_SLACK = 1.0  # overlap of two singleton blocks tolerated (loss noticed late)
# Errors that charge a run for its process's death or its lease's end: innocent when its
# handler was not running at the time.
CHARGES = ("WorkerDied", "WorkerLost", "Quarantined", "LeaseExpired")
# Errors a job earns on its own whatever its handler did: the task's timeout, an operator.
OWN = ("TimeoutError", "Cancelled by")
# What a lost lease (or a lost host) records when it forgives the attempt: no charge.
NOT_CHARGED = "not charged"
# The worker's completion of a handler that returned, failed: a data error of one row in
# a group commit, or a lost connection whose outcome went unreconciled. (An effect
# transaction whose connection died before its commit must run again: not counted.)
COMPLETION = "completion failed"
ACCOUNTS = 4
CAPPED = "capped"
# The faults, by name; "deploy v2" happens once, at the middle of the run.
FAULTS = ("kill worker", "terminate worker", "terminate supervisor", "terminate producer",
          "terminate singleton", "outage", "deploy v2")  # fmt: skip
# The sessions of each kind pg_terminate_backend ends, by their application_name.
SESSIONS = {
    "worker": "application_name LIKE 'forklift-worker:%%'",
    "supervisor": "application_name = 'forklift-supervisor'",
    "producer": "application_name IN ('forklift', 'forklift-listener', 'forklift-wait')",
    "singleton": "application_name = 'forklift-singleton'",
}


# -- what the run records ------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """One producer call, timed (wall clock, comparable with the faults' windows)."""

    kind: str
    started: float
    ended: float
    outcome: str  # "ok", or the exception's class name

    @property
    def seconds(self) -> float:
        return self.ended - self.started


@dataclass
class Window:
    """One fault, from its start to the world's undoing of it (wall clock)."""

    kind: str
    started: float
    ended: float = 0.0
    detail: str = ""


@dataclass
class Record:
    """Everything the load's threads saw, appended from many threads (list.append and
    Counter increments under `lock`)."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    calls: list[Call] = field(default_factory=list)
    faults: list[Window] = field(default_factory=list)
    batches: list[int] = field(default_factory=list)
    failed_blocks: set[int] = field(default_factory=set)  # batches whose block raised
    held: list[tuple[int, float, float]] = field(default_factory=list)  # singleton blocks
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    errors: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # job: history
    jobs: dict[int, str] = field(default_factory=dict)  # job id: task, as enqueued

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    @contextlib.contextmanager
    def call(self, kind: str) -> Iterator[None]:
        """Time a producer call; its exception, if any, is counted and passed on."""
        started = time.time()
        outcome = "ok"
        try:
            yield
        except Exception as exc:
            outcome = type(exc).__name__
            raise
        finally:
            with self.lock:
                self.calls.append(Call(kind, started, time.time(), outcome))
                self.counts[f"{kind}: {outcome}"] += 1

    def enqueued(self, ids: Sequence[int], task: str) -> None:
        with self.lock:
            for i in ids:
                self.jobs[i] = task


# -- the run -------------------------------------------------------------------------------


class Database:
    """The run's schema, as the bench's own sessions see it: checks, operator, faults."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.dsn = dsn
        self.schema = schema

    @contextlib.contextmanager
    def connect(self) -> Iterator[psycopg.Connection[Any]]:
        with psycopg.connect(self.dsn, autocommit=True, connect_timeout=5) as conn:
            yield conn

    def create_effects(self) -> None:
        """The handlers' effects table: one row per commit, no unique key."""
        with self.connect() as db:
            db.execute(
                f'CREATE TABLE "{self.schema}".effects (job_id bigint NOT NULL, attempt int,'
                " task text, batch_id bigint, note text,"
                " at timestamptz NOT NULL DEFAULT clock_timestamp())"
            )

    def rows(self, sql: str, *params: Any) -> list[tuple[Any, ...]]:
        """`sql` ({s}: the schema) on a fresh connection; [] while the database is away."""
        try:
            with self.connect() as db:
                return db.execute(sql.format(s=f'"{self.schema}"'), params).fetchall()
        except psycopg.OperationalError:
            return []

    def forklift(self, *argv: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """The operator's CLI, against the run's schema, straight to the database."""
        env = {**os.environ, "FORKLIFT_DATABASE_URL": self.dsn, "FORKLIFT_SCHEMA": self.schema}
        return subprocess.run(
            [sys.executable, "-m", "forklift", *argv],
            env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip


class Fleets:
    """The two `forklift run` fleets: the current version's and the second version's,
    which a rolling deploy starts beside it."""

    def __init__(self, args: argparse.Namespace, env: dict[str, str], logdir: Path) -> None:
        flags = [
            "--workers", str(args.workers), "--concurrency", str(args.concurrency),
            "--lease", f"{LEASE:g}s", "--grace", "5s", "--kill-grace", "2s",
            "--cancel-grace", "2s", "--queues", f"default,{CAPPED}",
        ]  # fmt: skip
        (logdir / "v2").mkdir()
        self.current = Fleet(env, logdir, flags, app="bench.interactions_app:app")
        self.second = Fleet(env, logdir / "v2", flags, app="bench.interactions_app:app_v2")

    def start(self) -> None:
        self.current.start(2)
        self.current.wait_ready(timeout=60)

    def workers(self) -> list[int]:
        return self.current.workers() + self.second.workers()

    def deploy(self) -> str:
        """A rolling deploy: one supervisor of the current version SIGTERMed, one of the
        second version started beside the rest."""
        old = self.current.procs[-1]
        old.signal(signal.SIGTERM)
        self.current.procs.remove(old)
        self.current.retired.append(old)
        new = self.second.start()[0]
        code = old.wait(timeout=30)
        return f"pid {old.pid} exited {code}, v2 pid {new.pid}"

    def stop(self, record: Record) -> None:
        """Every supervisor stopped, its exit code counted (a retired one's too)."""
        for fleet in (self.current, self.second):
            for proc in fleet.retired:
                record.count(f"supervisor exit {proc.popen.poll()}")
            for code in fleet.stop(timeout=30):
                record.count(f"supervisor exit {code}")

    def kill(self) -> None:
        self.current.kill()
        self.second.kill()


class Traffic:
    """The producers' ordinary calls: the feeder's jobs, the enqueues into the queue held
    at its max depth, and the singleton's holders."""

    def __init__(
        self,
        app: forklift.App,
        capped_app: forklift.App,
        record: Record,
        rng: random.Random,
        stop: threading.Event,
        poison_every: float,
    ) -> None:
        self.app = app
        self.capped_app = capped_app
        self.record = record
        self.rng = rng
        self.stop = stop
        self.poison_every = poison_every

    def feed(self) -> None:
        """A quarter second of ordinary traffic, and a poison job when it is due."""
        r, n = self.rng, self.record.counts["fed"]
        specs: list[forklift.JobSpec] = []
        for i in range(4):
            task = "aplain" if i % 2 else "plain"
            specs.append(forklift.JobSpec(task, {"key": f"p{n}-{i}", "pause": 0.02}))
        specs.append(forklift.JobSpec("metered", {"key": f"m{n}"}))
        if n % 3 == 0:
            specs.append(forklift.JobSpec("chatty", {"key": f"c{n}", "which": n // 3}))
        self.record.count("fed")
        with self.record.call("enqueue_many"):
            ids = self.app.enqueue_many(specs)
        for spec, job in zip(specs, ids, strict=True):
            self.record.enqueued([job], spec.task)
        overrun = r.random() < 0.03
        args = {
            "account": r.randrange(ACCOUNTS),
            "seconds": ia.KEYED_TIMEOUT * 2 if overrun else 0.4,
            "stubborn": r.random() < 0.5,
        }
        with self.record.call("enqueue"):
            job = self.app.enqueue("keyed", args)
        self.record.enqueued([job], "keyed")
        if n % max(1, round(self.poison_every * 4)) == 0:
            with self.record.call("enqueue"):
                job = self.app.enqueue("poison", {"key": f"x{n}"})
            self.record.enqueued([job], "poison")

    def capped(self) -> None:
        """One enqueue into the queue held at its max depth."""
        with contextlib.suppress(forklift.QueueFull), self.record.call("enqueue capped"):
            job = self.capped_app.enqueue(
                "plain", {"key": f"q{secrets.token_hex(4)}"}, queue=CAPPED
            )
            self.record.enqueued([job], "plain")

    def singleton(self) -> None:
        """Try to hold the singleton; when held, hold it 3 s unless told it is lost."""
        me = threading.get_ident()
        with self.app.singleton("interactions") as held:
            if not held:
                return
            began = time.time()  # the wall clock: comparable with the faults' windows
            try:
                deadline = time.monotonic() + 3.0
                while time.monotonic() < deadline and not self.stop.is_set() and held:
                    time.sleep(0.05)
            except Exception:  # a documented "you lost it" ends the block
                self.record.count("singleton lost (told)")
            finally:
                with self.record.lock:
                    self.record.held.append((me, began, time.time()))
                    self.record.counts["singleton blocks held"] += 1


class Batches:
    """Batches with a callback, and the waiters on their results and their ends (on the
    App that enqueued them)."""

    def __init__(self, app: forklift.App, record: Record, stop: threading.Event) -> None:
        self.app = app
        self.record = record
        self.stop = stop
        self.waits: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=2_000)

    def batch(self) -> None:
        """One batch of 10 with a callback (every third filled in a batch block), its
        results and its end handed to the waiters."""
        n = len(self.record.batches)
        specs = [("member", {"key": f"b{n}-{i}", "pause": 0.3}) for i in range(10)]
        batch: Batch
        if n % 3 == 2:
            batch = self.block(n, specs)
        else:
            with self.record.call("enqueue_batch"):
                batch = self.app.enqueue_batch(
                    specs, on_complete="gather", on_complete_args={"tag": f"b{n}"}
                )
            with self.record.lock:
                self.record.batches.append(batch.id)
        self.record.enqueued(batch.job_ids, "member")
        for item in [
            *(("batch", batch) for _ in range(5)),
            *(("result", j) for j in batch.job_ids),
        ]:
            with contextlib.suppress(queue.Full):
                self.waits.put_nowait(item)

    def block(self, n: int, specs: list[tuple[str, dict[str, Any]]]) -> Batch:
        """`with app.batch() as w:` taken apart, so that each of its calls is timed alone
        (not the pause between its two chunks, while workers start on the first)."""
        with self.record.call("batch begin"):
            w = self.app.batch(on_complete="gather", on_complete_args={"tag": f"b{n}"})
            w.__enter__()
        with self.record.lock:
            self.record.batches.append(w.id)
        failed: Exception | None = None
        try:
            with self.record.call("batch add"):
                w.enqueue_many(specs[:5])
            self.stop.wait(0.5)
            with self.record.call("batch add"):
                w.enqueue_many(specs[5:])
        except Exception as exc:
            failed = exc
            with self.record.lock:
                self.record.failed_blocks.add(w.id)
        with self.record.call("batch seal"):
            w.__exit__(None if failed is None else type(failed), failed, None)
        if failed is not None:
            raise failed
        return w

    def wait_one(self) -> None:
        """One waiter's turn: a result or a batch's end, 15 s at most."""
        try:
            kind, what = self.waits.get(timeout=0.5)
        except queue.Empty:
            return
        try:
            if kind == "batch":
                what.wait(timeout=15)
            else:
                self.app.result(what, timeout=15)
            self.record.count(f"wait {kind}: ok")
        except Exception as exc:
            self.record.count(f"wait {kind}: {type(exc).__name__}")


class Operator:
    """The operator's chores through the CLI, in turn: cancel a job, cancel a batch,
    purge ended jobs (their error histories kept first, for the checks)."""

    def __init__(self, database: Database, record: Record) -> None:
        self.database = database
        self.record = record

    def operate(self) -> None:
        """The next of the operator's chores, in turn."""
        turn = self.record.counts["operator turns"] % 4
        self.record.count("operator turns")
        if turn == 0:
            found = self.database.rows(
                "SELECT id FROM {s}.jobs WHERE task = 'keyed' AND state = 'running'"
                " ORDER BY started_at LIMIT 1"
            )
            if found:
                done = self.database.forklift("jobs", "cancel", str(found[0][0]))
                self.record.count(f"jobs cancel: exit {done.returncode}")
        elif turn == 1:
            found = self.database.rows(
                "SELECT id FROM {s}.batches WHERE finished_at IS NULL ORDER BY id DESC LIMIT 1"
            )
            if found:
                done = self.database.forklift("batches", "cancel", str(found[0][0]))
                self.record.count(f"batches cancel: exit {done.returncode}")
        else:
            states = ("dead", "cancelled") if turn == 2 else ("succeeded",)
            for state in states:
                self.keep_errors()  # what a purge deletes, its history kept first
                done = self.database.forklift(
                    "jobs", "purge", "--state", state, "--older-than", "2s"
                )
                self.record.count(f"jobs purge {state}: exit {done.returncode}")

    def keep_errors(self) -> None:
        """Keep every job's error history (it only grows) before a purge deletes it."""
        for job, errors in self.database.rows(
            "SELECT id, errors FROM {s}.jobs WHERE errors <> '[]'"
        ):
            with self.record.lock:
                if len(errors) >= len(self.record.errors.get(job, [])):
                    self.record.errors[job] = errors


class Faults:
    """One fault every --fault-every seconds, kinds in a shuffled cycle; the rolling
    deploy once, at the middle of the run. The database goes away through `cluster`
    (stopped) when the run has one, else through `proxy` (the workers cut off)."""

    def __init__(
        self,
        args: argparse.Namespace,
        database: Database,
        fleets: Fleets,
        record: Record,
        rng: random.Random,
        stop: threading.Event,
        cluster: Cluster | None,
        proxy: ProxyProcess | None,
    ) -> None:
        self.args = args
        self.database = database
        self.fleets = fleets
        self.record = record
        self.rng = rng
        self.stop = stop
        self.cluster = cluster
        self.proxy = proxy

    def run(self) -> None:
        """Inject faults until the run stops."""
        kinds = [k for k in FAULTS if k in self.args.faults and k != "deploy v2"]
        kinds += ["kill worker"] if "kill worker" in kinds else []  # SIGKILLs twice as often
        cycle: list[str] = []
        middle = time.monotonic() + self.args.minutes * 30
        deployed = False
        while not self.stop.wait(self.args.fault_every):
            if not deployed and "deploy v2" in self.args.faults and time.monotonic() >= middle:
                deployed = True
                self.inject("deploy v2", self.fleets.deploy)
                continue
            if not kinds:
                continue
            if not cycle:
                cycle = self.rng.sample(kinds, len(kinds))
            kind = cycle.pop()
            if kind == "kill worker":
                self.inject(kind, self.kill_worker)
            elif kind == "outage":
                self.inject(kind, self.outage)
            else:
                self.inject(kind, functools.partial(self.terminate, kind.split()[1]))

    def inject(self, kind: str, harm: Callable[[], str]) -> None:
        window = Window(kind, time.time())
        with self.record.lock:
            self.record.faults.append(window)
        try:
            window.detail = harm()
        except Exception as exc:
            window.detail = f"failed: {type(exc).__name__}: {exc}"
        window.ended = time.time()
        say(f"  {time.strftime('%H:%M:%S')} {kind:<20} {window.detail}")

    def kill_worker(self) -> str:
        pids = self.fleets.workers()
        if not pids:
            return "no worker"
        pid = self.rng.choice(pids)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        return f"pid {pid}"

    def terminate(self, who: str) -> str:
        """pg_terminate_backend on every session of one kind, in this run's database only."""
        ended = self.database.rows(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
            f" AND {SESSIONS[who]}"
        )
        return f"{len(ended)} sessions"

    def outage(self) -> str:
        """The database away for twice the lease: stopped (embedded) or cut off from the
        workers by the proxy."""
        seconds = 2 * LEASE
        if self.cluster is not None:
            self.cluster.stop("fast")
            self.stop.wait(seconds)
            self.cluster.start()
            return f"server stopped {seconds:g} s"
        assert self.proxy is not None
        self.proxy.cut()
        self.stop.wait(seconds)
        self.proxy.restore()
        return f"workers cut off {seconds:g} s"

    def heal(self) -> None:
        """The database back within everyone's reach, whatever fault the stop cut short."""
        if self.proxy is not None:
            self.proxy.restore()
        if self.cluster is not None and not self.cluster.running:
            self.cluster.start()


class Soak:
    """One run: its database, its fleets, and the load's threads, stopped together."""

    def __init__(
        self,
        args: argparse.Namespace,
        dsn: str,
        worker_dsn: str,
        cluster: Cluster | None = None,
        proxy: ProxyProcess | None = None,
    ) -> None:
        """`dsn` for the bench's own sessions (checks, operator, faults, producers);
        `worker_dsn` for the supervisors' (through the proxy, if any)."""
        self.args = args
        self.cluster = cluster
        self.database = Database(dsn, f"ix_{secrets.token_hex(4)}")
        self.logdir = Path(tempfile.mkdtemp(prefix="forklift-interactions-"))
        self.diary = self.logdir / "diary.txt"
        self.record = Record()
        self.stop = threading.Event()
        # Three producers' Apps (each its own pool of 4): the batches' and their waiters',
        # the queue at max depth's, and the rest's. A defect that starves one pool then
        # shows in its calls without silencing the load of the others.
        schema = self.database.schema
        self.apps = [ia.current(forklift.App(dsn, schema=schema)) for _ in range(3)]
        app, batch_app, capped_app = self.apps
        env = child_env(worker_dsn, schema)
        env.update(FORKLIFT_LOG_FORMAT="text", **{ia.DIARY_ENV: str(self.diary)})
        self.fleets = Fleets(args, env, self.logdir)
        rng = random.Random(args.seed)
        self.traffic = Traffic(app, capped_app, self.record, rng, self.stop, args.poison_every)
        self.batches = Batches(batch_app, self.record, self.stop)
        self.operator = Operator(self.database, self.record)
        self.faults = Faults(
            args, self.database, self.fleets, self.record, rng, self.stop, cluster, proxy
        )

    def create(self) -> None:
        self.apps[0].migrate()
        self.database.create_effects()
        self.database.forklift(
            "queues", "limit", CAPPED, "--max-depth", str(self.args.max_depth), "--force"
        )
        # Paused for the load, so that it stays full: resumed for the drain.
        self.database.forklift("queues", "pause", CAPPED, "--force")

    def close(self) -> None:
        self.stop.set()
        self.fleets.kill()
        for app in self.apps:
            app.close()

    def loop(self, every: float, step: Callable[[], None], what: str) -> None:
        """`step()` every `every` seconds until the run stops; its errors counted."""
        while not self.stop.is_set():
            began = time.monotonic()
            try:
                step()
            except Exception as exc:
                self.record.count(f"{what} raised {type(exc).__name__}")
            self.stop.wait(max(0.0, began + every - time.monotonic()))

    def run(self) -> None:
        a = self.args
        self.fleets.start()
        say(f"fleet ready; load and faults for {a.minutes:g} min ...")
        threads = [
            ("feeder", 0.25, self.traffic.feed, 1),
            ("batches", 3.0, self.batches.batch, 1),
            ("waiter", 0.0, self.batches.wait_one, a.waiters),
            ("capped", 0.2, self.traffic.capped, 8),
            ("singleton", 0.2, self.traffic.singleton, 3),
            ("operator", a.operator_every, self.operator.operate, 1),
        ]
        running = [
            threading.Thread(target=self.loop, args=(every, step, name), name=name, daemon=True)
            for name, every, step, n in threads
            for _ in range(n)
        ]
        running.append(threading.Thread(target=self.faults.run, name="faults", daemon=True))
        for t in running:
            t.start()
        self.stop.wait(a.minutes * 60)
        self.stop.set()
        say("load over: stopping its threads ...")
        for t in running:
            t.join(timeout=60)
        self.faults.heal()
        self.database.forklift("queues", "resume", CAPPED)
        self.drain()

    def drain(self) -> None:
        say(f"waiting up to {self.args.drain:g} s for every job to end ...")
        deadline = time.monotonic() + self.args.drain
        while time.monotonic() < deadline:
            left = self.database.rows(
                "SELECT count(*) FROM {s}.jobs WHERE state IN ('ready', 'running')"
            )
            if left and left[0][0] == 0:
                break
            time.sleep(1.0)
        self.operator.keep_errors()
        self.fleets.stop(self.record)


# -- the checks ----------------------------------------------------------------------------


@dataclass
class HandlerRun:
    """One handler run, from the diary: its start, its last sign of life, its stop."""

    job: int
    attempt: int
    pid: int
    task: str
    key: str
    start: float
    last: float
    stopped: bool = False  # its handler returned or raised
    raised: bool = False


def read_diary(path: Path) -> list[HandlerRun]:
    """The handler runs, in the order they started; a beat or stop belongs to the latest
    run started of its (job, attempt, pid)."""
    runs: list[HandlerRun] = []
    open_: dict[tuple[int, int, int], HandlerRun] = {}
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return runs
    for line in text.splitlines(keepends=True):
        if not line.endswith("\n"):
            continue  # a line cut short by a kill mid-write (O_APPEND: only the last)
        event, job, attempt, pid, at, task, key = line.rstrip("\n").split(" ", 6)
        ident = (int(job), int(attempt), int(pid))
        if event == "start":
            run = HandlerRun(*ident, task, key, float(at), float(at))
            runs.append(run)
            open_[ident] = run
        elif (run_ := open_.get(ident)) is not None:
            run_.last = max(run_.last, float(at))
            run_.stopped = run_.stopped or event in ("stop", "raise")
            run_.raised = run_.raised or event == "raise"
    return runs


@dataclass
class Column:
    name: str
    value: int
    lines: list[str]  # the evidence, printed under the table


def effects_twice(database: Database) -> Column:
    rows = database.rows(
        "SELECT job_id, min(task), count(*), array_agg(attempt ORDER BY at)"
        " FROM {s}.effects GROUP BY job_id HAVING count(*) > 1 ORDER BY job_id"
    )
    lines = [f"job {j} ({task}): {n} effect rows, attempts {att}" for j, task, n, att in rows]
    return Column("effects twice", len(rows), lines)


def jobs_lost(database: Database) -> Column:
    rows = database.rows(
        "SELECT id, task, state::text, attempts, lease_owner FROM {s}.jobs"
        " WHERE state IN ('ready', 'running') ORDER BY id"
    )
    lines = [
        f"job {j} ({t}): {st} after the drain, attempts {a}, owner {o}" for j, t, st, a, o in rows
    ]
    return Column("jobs lost", len(rows), lines)


def innocent_charged(database: Database, record: Record, runs: Sequence[HandlerRun]) -> Column:
    by_run: dict[tuple[int, int, int], list[HandlerRun]] = defaultdict(list)
    for run in runs:
        by_run[(run.job, run.attempt, run.pid)].append(run)
    tasks = {job: task for job, task in database.rows("SELECT id, task FROM {s}.jobs")}
    tasks = {**record.jobs, **tasks}
    innocent: dict[int, str] = {}
    for job, errors in sorted(record.errors.items()):
        for e in errors:
            error = str(e.get("error") or "")
            if error.startswith(OWN) or NOT_CHARGED in error:
                continue
            pid = owner_process(str(e.get("worker") or ""))[1]
            attempt = int(e.get("attempt") or 0)
            handled = by_run.get((job, attempt, pid), [])
            if error.startswith(CHARGES):
                if any(not r.stopped for r in handled):
                    continue  # its handler was running when its process died: its doing
                why = (
                    f"its handler had ended {at_clock(max(r.last for r in handled))}"
                    if handled
                    else "its handler never started on that pid"
                )
            elif COMPLETION in error:  # innocent if its handler had returned
                returned = [r for r in handled if r.stopped and not r.raised]
                if not returned:
                    continue
                why = f"its handler had returned {at_clock(max(r.last for r in returned))}"
            else:
                continue
            at = datetime.datetime.fromisoformat(str(e.get("at"))).timestamp()
            innocent.setdefault(
                job,
                f"job {job} ({tasks.get(job, '?')}) attempt {attempt} on pid {pid}: charged "
                f"{error[:80]!r} at {time.strftime('%H:%M:%S', time.localtime(at))}; {why}; "
                f"{last_fault(record.faults, at)}",
            )
    return Column("innocent charged", len(innocent), list(innocent.values()))


def callbacks_not_once(database: Database, record: Record) -> Column:
    counts = dict(
        database.rows(
            "SELECT batch_id, count(*) FROM {s}.effects WHERE task = 'gather' GROUP BY batch_id"
        )
    )
    states = {
        b: (state, outcome, sealed)
        for b, state, outcome, sealed in database.rows(
            "SELECT b.id, coalesce(j.state::text, 'no callback job'), b.outcome,"
            " b.sealed_at IS NOT NULL FROM {s}.batches AS b"
            " LEFT JOIN {s}.jobs AS j ON j.id = b.callback_job_id"
        )
    }
    lines = []
    for batch in record.batches:
        n = counts.get(batch, 0)
        state, outcome, sealed = states.get(batch, ("batch row gone", None, True))
        if n == 0 and not sealed and batch in record.failed_blocks:
            # Its block failed while the database was away, and so did the seal: it is
            # left to the abandoned-batch sweep, on a clock longer than this run's.
            record.count("batches left unsealed by a failed block")
            continue
        if n != 1:
            lines.append(
                f"batch {batch}: callback effect {n}x (callback {state}, outcome {outcome})"
            )
    return Column("callbacks not 1x", len(lines), lines)


def limit_exceeded(runs: Sequence[HandlerRun], limit: int = 1) -> Column:
    """Runs of `keyed` that started while `limit` runs of the same account were in their
    handlers (a run is in its handler from its start to its stop, or to its last beat
    when its process died: never longer than it really was)."""
    by_key: dict[str, list[HandlerRun]] = defaultdict(list)
    for run in runs:
        if run.task == "keyed":
            by_key[run.key].append(run)
    lines = []
    rerun = 0  # of them, a job's attempt started beside its own earlier attempt
    for key, mine in sorted(by_key.items()):
        mine.sort(key=lambda r: r.start)
        for i, run in enumerate(mine):
            inside = [o for o in mine[:i] if o.last > run.start]
            if len(inside) < limit:
                continue
            rerun += any(o.job == run.job for o in inside)
            others = ", ".join(
                f"job {o.job}/{o.attempt} pid {o.pid} from {at_clock(o.start)[3:]} to "
                f"{at_clock(o.last)[3:]}" + ("" if o.stopped else " (process died)")
                for o in inside
            )
            lines.append(
                f"account {key}: job {run.job}/{run.attempt} pid {run.pid} started "
                f"{at_clock(run.start)} while in its handler: {others}"
            )
    column = Column("limit exceeded", len(lines), lines)
    if lines:
        lines.insert(0, f"({rerun} of these: a job's attempt beside its own earlier one)")
    return column


def singleton_twice(record: Record) -> Column:
    lines = []
    ordered = sorted(record.held, key=lambda h: h[1])
    for i, (who, start, end) in enumerate(ordered):
        for other, o_start, o_end in ordered[i + 1 :]:
            if o_start >= end:
                break
            overlap = min(end, o_end) - o_start
            if other != who and overlap > SINGLETON_SLACK:
                lines.append(
                    f"thread {who % 10_000} held it {end - start:.2f} s; thread "
                    f"{other % 10_000} entered {o_start - start:.2f} s in ({overlap:.2f} s "
                    f"both); {last_fault(record.faults, o_start)}"
                )
    return Column("singleton twice", len(lines), lines)


def slow_producer(record: Record, embedded: bool) -> Column:
    """Producer calls over SLOW_CALL s that overlap no window of the database away (the
    embedded server's outages; the proxy's cuts reach the workers alone)."""
    away = [(w.started, w.ended + SETTLE) for w in record.faults if w.kind == "outage" and embedded]
    slow = [
        c
        for c in record.calls
        if c.seconds > SLOW_CALL and not any(c.started < e and c.ended > s for s, e in away)
    ]
    kinds: dict[str, int] = defaultdict(int)
    for c in slow:
        kinds[f"{c.kind} {c.outcome}"] += 1
    lines = [
        f"{c.kind} at {time.strftime('%H:%M:%S', time.localtime(c.started))}: "
        f"{c.seconds:.2f} s, {c.outcome}; {last_fault(record.faults, c.started)}"
        for c in sorted(slow, key=lambda c: c.started)
    ]
    if lines:
        lines.insert(
            0, "(by call: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())) + ")"
        )
    return Column("slow producer", len(slow), lines)


def at_clock(at: float) -> str:
    """Wall time `at` as "at HH:MM:SS.mmm"."""
    return f"at {time.strftime('%H:%M:%S', time.localtime(at))}.{int(at % 1 * 1000):03d}"


def last_fault(faults: Sequence[Window], at: float) -> str:
    """The last fault begun before wall time `at`, in words."""
    before = [w for w in faults if w.started <= at]
    if not before:
        return "no fault before it"
    w = before[-1]
    return f"the last fault, {w.kind}, began {at - w.started:.1f} s before"


def check(soak: Soak) -> list[Column]:
    runs = read_diary(soak.diary)
    return [
        effects_twice(soak.database),
        jobs_lost(soak.database),
        innocent_charged(soak.database, soak.record, runs),
        callbacks_not_once(soak.database, soak.record),
        limit_exceeded(runs),
        singleton_twice(soak.record),
        slow_producer(soak.record, soak.cluster is not None),
    ]


def report(soak: Soak, columns: Sequence[Column], seconds: float) -> None:
    a = soak.args
    states = dict(soak.database.rows("SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))
    where = "embedded server" if a.embedded else redact(a.dsn)
    title = (
        f"forklift interactions: {a.minutes:g} min on the {where}, 2 supervisors x "
        f"{a.workers} workers x concurrency {a.concurrency}, seed {a.seed}; "
        f"{len(soak.record.jobs):,} jobs enqueued, {len(soak.record.batches)} batches; "
        f"left: {', '.join(f'{k} {v:,}' for k, v in sorted(states.items()))}; "
        f"{seconds:.0f} s in all, load {load_average()}"
    )
    print_grid(title, [[c.name for c in columns], [str(c.value) for c in columns]])
    for c in columns:
        if c.lines:
            print(f"\n{c.name}: {c.value}")
            for line in c.lines[:15]:
                print(f"  {line}")
            if len(c.lines) > 15:
                print(f"  ... and {len(c.lines) - 15} more lines")
    faults: dict[str, int] = defaultdict(int)
    for w in soak.record.faults:
        faults[w.kind] += 1
    print("\nfaults injected: " + ", ".join(f"{k} {v}" for k, v in sorted(faults.items())))
    forgiven = sum(
        NOT_CHARGED in str(e.get("error") or "") for es in soak.record.errors.values() for e in es
    )
    print(f"attempts forgiven (lost before their handlers were seen running): {forgiven}")
    print(
        "what the load saw: " + ", ".join(f"{k} {v}" for k, v in sorted(soak.record.counts.items()))
    )
    sys.stdout.flush()


def interactions(args: argparse.Namespace) -> int:
    began = time.monotonic()
    with contextlib.ExitStack() as stack:
        if args.embedded:
            cluster = stack.enter_context(Cluster(prefix="forklift-interactions-"))
            soak = Soak(args, cluster.dsn, cluster.dsn, cluster=cluster)
        else:
            dsn = stack.enter_context(fresh_database(args.dsn, "forklift_interactions"))
            proxy = ProxyProcess.to(dsn)
            stack.callback(proxy.close)
            soak = Soak(args, dsn, proxy.dsn_through(dsn), proxy=proxy)
        stack.callback(soak.close)
        say(f"schema {soak.database.schema}; logs in {soak.logdir}; load average {load_average()}")
        soak.create()
        soak.run()
        columns = check(soak)
        report(soak, columns, time.monotonic() - began)
        append_result(
            args.results,
            {
                "minutes": args.minutes,
                "seed": args.seed,
                "embedded": args.embedded,
                "jobs": len(soak.record.jobs),
                "columns": {c.name: c.value for c in columns},
            },
        )
    return 1 if any(c.value for c in columns) else 0


def fault_list(text: str) -> tuple[str, ...]:
    kinds = tuple(kind.strip() for kind in text.split(",") if kind.strip())
    unknown = [k for k in kinds if k not in FAULTS]
    if unknown:
        raise argparse.ArgumentTypeError(f"{unknown[0]!r}: choose from " + ", ".join(FAULTS))
    return kinds


def build_parser() -> argparse.ArgumentParser:
    p = parser("python -m bench.interactions", __doc__)
    p.add_argument("--minutes", type=positive_float, default=2.0, help="of load (%(default)s)")
    p.add_argument(
        "--embedded", action="store_true", help="a private embedded server instead of --dsn"
    )
    p.add_argument("--workers", type=positive, default=2, help="per supervisor (%(default)s)")
    p.add_argument("--concurrency", type=positive, default=4, help="per worker (%(default)s)")
    p.add_argument("--waiters", type=positive, default=50, help="threads waiting (%(default)s)")
    p.add_argument("--max-depth", type=positive, default=20, help="of queue capped (%(default)s)")
    p.add_argument(
        "--poison-every", type=positive_float, default=20.0, help="seconds (%(default)s)"
    )
    p.add_argument("--fault-every", type=positive_float, default=6.0, help="seconds (%(default)s)")
    p.add_argument(
        "--operator-every", type=positive_float, default=5.0, help="seconds (%(default)s)"
    )
    p.add_argument(
        "--drain", type=positive_float, default=90.0, help="seconds at most (%(default)s)"
    )
    p.add_argument("--seed", type=int, default=None, help="for the random choices")
    p.add_argument(
        "--faults",
        type=fault_list,
        default=FAULTS,
        metavar="KIND,...",
        help="inject only these (default: all): " + ", ".join(FAULTS),
    )
    p.add_argument(
        "--results",
        type=Path,
        default=REPO_ROOT / "bench" / "results" / "interactions.jsonl",
        help="the JSON lines file a row per run is appended to",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # The pool's own complaints while the database is away, one per reconnection try:
    # the run's calls and the table say what came of them.
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    if args.seed is None:
        args.seed = random.randrange(2**31)
    say(f"interactions: {args.minutes:g} min, seed {args.seed}")
    with sigterm_exits():
        try:
            return interactions(args)
        except (OSError, psycopg.Error, forklift.ForkliftError, RuntimeError) as exc:
            say(f"the run could not be made: {type(exc).__name__}: {exc}")
            return 2


if __name__ == "__main__":
    sys.exit(main())
