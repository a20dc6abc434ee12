"""The peer job queues of bench.compare, seen from the orchestrator (the project's venv).

Each peer is a `Contender` whose producer and workers run in the peers venv
(.venv-peers, see bench._peers_env): the producer as `python -m bench.peers PEER ...`
(bench/peers/_cli.py), the workers as the peer's own command line, each process in its
own session like forklift's. This module only knows their commands, their settings and
how to count their finished jobs; their code is in bench/peers/.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from bench._contenders import WORKERS, Contender, Setting
from bench._harness import REPO_ROOT, Command, ForkliftProcess


class Peer(Contender):
    """A peer in the run's database; `python` is the peers venv's interpreter."""

    def __init__(self, dsn: str, python: Path, best: int) -> None:
        super().__init__(dsn)
        self.python = str(python)
        self.best = best  # the value of its main knob in the "best" setting
        self.enqueued = 0  # jobs enqueued since the last reset
        self.env["BENCH_DSN"] = dsn

    def cli(self, *args: object) -> dict[str, Any]:
        """Run `python -m bench.peers NAME ARGS` in the peers venv; its JSON answer."""
        argv = [self.python, "-m", "bench.peers", self.name, *map(str, args)]
        done = subprocess.run(argv, env=self.env, cwd=REPO_ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[2:])} failed:\n{done.stderr[-3000:]}")
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return answer

    def command(self, *args: str) -> tuple[str, ...]:
        return (self.python, "-m", *args)

    def make_setting(self, label: str, processes: int, *args: str, why: str = "") -> Setting:
        """`processes` copies of the command `python -m ARGS` (the prefix left out of the text)."""
        shown = " ".join(args)
        if processes > 1:
            shown = f"{processes} x {shown}"
        return Setting(label, shown, (self.command(*args),) * processes, why)

    # -- the bench's steps, the peer's way ------------------------------------------------

    def create(self) -> None:
        self.cli("install")

    def drop(self) -> None:
        try:
            super().drop()
        finally:
            self.cli("uninstall")  # what lives outside the database (Celery's Redis keys)

    def reset(self) -> None:
        self.cli("reset")
        self.enqueued = 0

    def analyze(self) -> None:
        """Fresh statistics after a fill (as autovacuum would have, in time)."""
        if self.table:
            self.db.execute(f"ANALYZE {self.table}")

    def worker(self, *options: str) -> tuple[str, ...]:
        """The arguments after `python -m` of one worker process, with `options`."""
        raise NotImplementedError

    def setting_for(self, purpose: str) -> Setting:
        processes = 1 if purpose == "latency" else WORKERS
        return self.make_setting(purpose, processes, *self.worker())

    def sweep_setting(self, value: int) -> Setting:
        knob = (self.knob, str(value))
        return self.make_setting(" ".join(knob), WORKERS, *self.worker(*knob))

    def enqueue_bulk(self, n: int, batch: int, *, progress: bool = False) -> float:
        seconds = float(self.cli("enqueue", "noop", n, "--batch", batch)["seconds"])
        self.enqueued += n
        return seconds

    def enqueue_one_by_one(self, n: int, task: str = "noop") -> float:
        seconds = float(self.cli("enqueue-one", n)["seconds"])
        self.enqueued += n + 1
        return seconds

    def fill(self, n: int, batch: int, *, progress: bool = False) -> None:
        self.reset()
        self.enqueue_bulk(n, batch)
        self.analyze()

    def spawn(self, argv: tuple[str, ...]) -> ForkliftProcess:
        proc = Command(argv, self.env, self.logdir)
        self.procs.append(proc)
        return proc

    def produce_latency(self, jobs: int, rate: float) -> None:
        self.cli("latency", jobs, rate)

    def cpu(self, jobs: int, iterations: int) -> float:
        self.reset()
        self.cli("enqueue", "burn", jobs, "--kwargs", json.dumps({"iterations": iterations}))
        self.enqueued += jobs
        self.setting = self.setting_for("cpu")
        interval, self.poll_interval = self.poll_interval, 0.02  # as bench.cpu polls
        try:
            return self.process(jobs, WORKERS, 1).seconds
        finally:
            self.poll_interval = interval

    def enqueue_nap(self, seconds: float) -> None:
        self.cli("enqueue", "nap", 1, "--kwargs", json.dumps({"seconds": seconds}))
        self.enqueued += 1

    def recovery(self, nap: float, timeout: float) -> float | None:
        return self.recovery_by_stamps(nap, timeout)

    def drain_settings(self) -> dict[str, Setting]:
        best = self.sweep_setting(self.best)
        return {
            "defaults": self.setting_for("defaults"),
            "best": Setting("best", best.command, best.argvs, self.best_why),
        }

    best_why = ""
    knob = ""  # the option of its main knob for tiny jobs
    table = ""  # its job table


class Pgqueuer(Peer):
    """pgqueuer 1.6: `pgq run` workers (through pgqueuer.run), one asyncpg connection each."""

    name = "pgqueuer"
    best_why = (
        "docs (guides/performance-tuning): 'Increase batch_size when jobs are short-lived'; "
        "no number given; the fastest of a sweep of 10/50/100/200/500"
    )

    knob = "--batch-size"
    table = "pgqueuer"

    def worker(self, *options: str) -> tuple[str, ...]:
        return ("bench.peers", "pgqueuer", "work", *options)

    def succeeded(self) -> int:
        # A finished job's row leaves the queue table (its log rows are aggregated away
        # every 30 s), so done = enqueued - still there.
        return self.enqueued - int(self.scalar("SELECT count(*) FROM pgqueuer"))


class Procrastinate(Peer):
    """procrastinate 3.10: `procrastinate worker` processes, async tasks, PsycopgConnector."""

    name = "procrastinate"
    best_why = (
        "its worker's --concurrency ('Number of parallel asynchronous jobs to process at "
        "once', default 1); the fastest of a sweep of 1/25/50/100/200/500"
    )
    knob = "--concurrency"
    table = "procrastinate_jobs"
    APP = ("procrastinate", "--log-level", "warning", "--app")

    def worker(self, *options: str) -> tuple[str, ...]:
        return (*self.APP, "bench.peers.procrastinate_peer.app", "worker", *options)

    def succeeded(self) -> int:
        return int(
            self.scalar("SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'")
        )


class Celery(Peer):
    """Celery 5.7 on the local Redis: one `celery worker` with its prefork pool."""

    name = "celery"
    knob = "--prefetch-multiplier"
    best_why = (
        "docs (userguide/optimizing, Prefetch Limits): with lots of short tasks 'you want "
        "this number to be large', 64 or 128; the fastest of a sweep of 4/16/64/128"
    )

    def __init__(self, dsn: str, python: Path, best: int, redis: str, queue: str) -> None:
        super().__init__(dsn, python, best)
        self.progress = self.logdir / "progress"
        self.progress.mkdir()
        self.queue = queue
        self.env.update(
            BENCH_REDIS=redis,
            BENCH_CELERY_QUEUE=queue,
            BENCH_PROGRESS=str(self.progress),
            # Celery warns at every start when run as root (this machine's user).
            PYTHONWARNINGS="ignore:You're running the worker with superuser privileges",
        )

    def pool_worker(self, pool: int, *options: str) -> tuple[str, ...]:
        name = f"{self.queue}@%h"
        return ("celery", "-A", "bench.peers.celery_peer", "-q", "worker", "-P", "prefork",
                "-c", str(pool), "-Q", self.queue, "-n", name, "--loglevel", "WARNING",
                *options)  # fmt: skip

    def setting_for(self, purpose: str) -> Setting:
        pool = 1 if purpose == "latency" else WORKERS
        return self.make_setting(purpose, 1, *self.pool_worker(pool))

    def sweep_setting(self, value: int) -> Setting:
        knob = (self.knob, str(value))
        return self.make_setting(" ".join(knob), 1, *self.pool_worker(WORKERS, *knob))

    def reset(self) -> None:
        super().reset()
        for path in self.progress.iterdir():
            path.unlink()

    def succeeded(self) -> int:
        total = 0
        for path in self.progress.iterdir():
            if path.suffix != ".tmp":
                total += int(path.read_text() or 0)
        return total


PEERS: dict[str, type[Peer]] = {p.name: p for p in (Pgqueuer, Procrastinate, Celery)}
