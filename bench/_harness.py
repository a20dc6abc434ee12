"""What the benchmark scripts under bench/ share.

Every script runs in a fresh schema `bench_<random>` that is dropped at the end, also on
error, Ctrl-C or SIGTERM: a subclass of `Bench` adds the script's own steps, and

    with MyBench(args.dsn).session() as bench:
        ...

creates the schema (forklift's tables in it) and drops it afterwards. `Bench` holds the
producer App, a database connection and the `python -m forklift ...` processes it
started (`ForkliftProcess`: its own session, its output in a temp file, its children
found through /proc). Also here: `parser()` (with --dsn) and the argparse types, the
/proc readings of CPU time and load, `percentile`, and `print_table`, the results table
(metric, value, target, met) every script ends with.

The scripts import this as `bench._harness`, so the repository root must be on
sys.path: `python -m bench.X` run from the root has it there; `python bench/X.py` puts
it there in the script's first lines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, Self
from urllib.parse import quote, urlencode

import psycopg
from psycopg import conninfo, sql

import forklift
from forklift import testing
from forklift._db import redact

DEFAULT_DSN = "postgresql://root@127.0.0.1:5432/test"
REPO_ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def say(message: str) -> None:
    """Progress, on stderr at once (stdout is for the results)."""
    print(message, file=sys.stderr, flush=True)


# -- command line ------------------------------------------------------------------------


def parser(prog: str, doc: str | None) -> argparse.ArgumentParser:
    """A parser whose --help shows the script's docstring, with --dsn on it already.

    The DSN: --dsn, else FORKLIFT_DATABASE_URL, else DEFAULT_DSN.
    """
    p = argparse.ArgumentParser(
        prog=prog, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--dsn",
        default=os.environ.get("FORKLIFT_DATABASE_URL") or DEFAULT_DSN,
        help="PostgreSQL URL (default: FORKLIFT_DATABASE_URL, else %(default)s)",
    )
    return p


def positive(text: str) -> int:
    """argparse type: a whole number >= 1 (underscores allowed, as in 10_000)."""
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 1")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def positive_float(text: str) -> float:
    """argparse type: a number > 0."""
    value = _number(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be > 0")
    return value


def non_negative_float(text: str) -> float:
    """argparse type: a number >= 0."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be >= 0")
    return value


# -- results -----------------------------------------------------------------------------


@dataclass
class Row:
    """One line of the results table."""

    metric: str
    value: str
    target: str = "-"
    met: bool | None = None  # None: informational, no target


@dataclass(frozen=True)
class Style:
    """A results table's column headers and its words for a target met or missed."""

    headers: tuple[str, str, str, str]
    yes: str
    no: str


YES_NO = Style(("metric", "value", "target", "met"), "yes", "NO")
MET = Style(("metric", "measured", "target", "verdict"), "met", "NOT MET")


def print_table(rows: Sequence[Row], note: str, style: Style = YES_NO) -> None:
    """The results on stdout: `note`, then one line per row."""

    def verdict(met: bool | None) -> str:
        return "-" if met is None else (style.yes if met else style.no)

    print_grid(
        note, [style.headers, *((r.metric, r.value, r.target or "-", verdict(r.met)) for r in rows)]
    )
    sys.stdout.flush()


def print_grid(title: str, cells: Sequence[Sequence[str]], *, right_align: bool = False) -> None:
    """`title`, then `cells` (the first row is the header) in columns between dashed rules.

    The first column is left-aligned; so are the others, or right-aligned with `right_align`.
    """
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    rule = "  ".join("-" * w for w in widths)
    print()
    print(title)
    print(rule)
    for i, row in enumerate(cells):
        values = zip(row, widths, strict=True)
        line = "  ".join(
            v.rjust(w) if right_align and j else v.ljust(w) for j, (v, w) in enumerate(values)
        )
        print(line.rstrip())
        if i == 0:
            print(rule)
    print(rule)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between closest ranks."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def append_result(path: Path, row: dict[str, Any]) -> None:
    """Append `row`, stamped with the time and the commit measured, to the JSON lines
    file `path` (a soak's history: one line per run)."""
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO_ROOT
    ).stdout.strip()
    stamped = {
        "at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": commit,
        **row,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(stamped) + "\n")
    say(f"appended to {path}")


# -- the machine -------------------------------------------------------------------------


def load_average() -> str:
    """The 1, 5 and 15 minute load averages, as "0.12, 0.34, 0.56"."""
    return ", ".join(f"{v:.2f}" for v in os.getloadavg())


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds `pid` (all its threads) has used so far (0 once gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0.0
    fields = stat.rpartition(")")[2].split()  # the name in parentheses may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # fields 14, 15: utime, stime


def machine_busy() -> float:
    """CPU seconds all processes on the machine have used since boot (/proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = values[3] + values[4]  # idle, iowait
    return (sum(values[:8]) - idle) / CLOCK_TICKS  # guest time is already in user


def others_busy(seconds: float) -> float:
    """Cores the rest of the machine keeps busy, sampled over `seconds`."""
    busy, own = machine_busy(), time.process_time()
    time.sleep(seconds)
    return max(0.0, machine_busy() - busy - (time.process_time() - own)) / seconds


def wait_quiet(max_cores: float, timeout: float) -> None:
    """Wait (up to `timeout` s) until the rest of the machine uses < `max_cores` cores."""
    if timeout <= 0:
        return
    loads: list[float] = []

    def quiet() -> bool:
        loads.append(others_busy(1.0))
        return loads[-1] < max_cores

    try:  # no pause between the rounds: each sample takes a second already
        testing.wait_for(quiet, timeout, interval=0, what="a quiet machine")
    except testing.WaitTimedOut:
        say(f"    the machine is busy ({loads[-1]:.2f} cores used by others): measuring anyway")
        return
    say(f"    others use {loads[-1]:.2f} cores now")


# -- processes ---------------------------------------------------------------------------


@contextlib.contextmanager
def sigterm_exits() -> Iterator[None]:
    """Turn SIGTERM into SystemExit so the cleanup in `finally` blocks runs."""

    def on_term(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def child_env(dsn: str, schema: str) -> dict[str, str]:
    """This process's environment plus what a forklift process of the bench needs."""
    env = dict(os.environ)
    env.update(
        FORKLIFT_DATABASE_URL=dsn,
        FORKLIFT_SCHEMA=schema,
        # the apps are loaded as bench.<module>:app
        PYTHONPATH=os.pathsep.join(
            p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p
        ),
        # `forklift run` serves /metrics on 127.0.0.1:9367 by default; a free port keeps
        # it from clashing with any other supervisor on this machine.
        FORKLIFT_METRICS_ADDR="127.0.0.1:0",
    )
    return env


class ForkliftProcess(testing.ForkliftProcess):
    """forklift.testing's process, its log in the bench's directory, run from the repo root."""

    def __init__(self, args: Sequence[str], env: dict[str, str], logdir: Path) -> None:
        log = logdir / f"forklift-{time.monotonic_ns()}.log"
        super().__init__(args, env, log, cwd=REPO_ROOT)

    @property
    def returncode(self) -> int | None:
        """Its exit code once it has exited (None while it runs)."""
        return self.popen.poll()

    def terminate(self) -> None:
        """SIGTERM it if it is still running, without waiting (stop() waits)."""
        self.signal(signal.SIGTERM)


def stopped(supervisor: ForkliftProcess, logged: list[str]) -> None:
    """SIGTERM a drain's supervisor and wait for it; what it printed goes to `logged`,
    and its exit code too if it was not 0."""
    code = supervisor.stop()
    logged += supervisor.output().splitlines()
    if code != 0:
        logged.append(f"supervisor {supervisor.pid} exited with {code}")


class Command(ForkliftProcess):
    """Any command (`argv`, the program first) handled as a ForkliftProcess: its own
    session, its output in a file in `logdir`, run from the repo root; a peer's worker."""

    def __init__(self, argv: Sequence[str], env: dict[str, str], logdir: Path) -> None:
        # Not super().__init__: that one starts `python -m forklift`; the rest is the same.
        self.args = list(argv)
        self.log_path = logdir / f"{Path(argv[0]).name}-{time.monotonic_ns()}.log"
        with self.log_path.open("wb") as log:
            self.popen = subprocess.Popen(
                list(argv),
                env=env,
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.popen.pid
        self._output = None


def database_url(dsn: str, dbname: str) -> str:
    """`dsn` (a URL or key=value) with database `dbname`, as a URL that libpq, psycopg and
    asyncpg all read: postgresql:///dbname?host=...&port=...&user=..."""
    params = {k: str(v) for k, v in conninfo.conninfo_to_dict(dsn).items() if k != "dbname"}
    return f"postgresql:///{quote(dbname)}?{urlencode(params)}"


@contextlib.contextmanager
def fresh_database(dsn: str, prefix: str) -> Iterator[str]:
    """A new database `<prefix>_<random>` on the server of `dsn`; yields its DSN and drops
    it at the end (also on error, Ctrl-C or SIGTERM), whoever is still connected to it."""
    name = f"{prefix}_{secrets.token_hex(4)}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield database_url(dsn, name)
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
        say(f"dropped database {name}")


# -- the bench ---------------------------------------------------------------------------


class Bench:
    """A fresh schema `bench_<random>`, the producer App on it, and the processes started.

    `register` puts the tasks of the workers' app on the producer App, so that enqueue
    calls validate their arguments as a real producer's do. `name` names the temp
    directory of the processes' output.
    """

    def __init__(
        self, dsn: str, register: Callable[[forklift.App], forklift.App], name: str
    ) -> None:
        self.dsn = dsn
        self.schema = f"bench_{secrets.token_hex(4)}"
        self.app = register(forklift.App(dsn, schema=self.schema))
        self.db: psycopg.Connection[Any] = psycopg.connect(dsn, autocommit=True)
        self.procs: list[ForkliftProcess] = []
        self.logdir = Path(tempfile.mkdtemp(prefix=f"forklift-bench-{name}-"))
        self.env = child_env(dsn, self.schema)

    @contextlib.contextmanager
    def session(self) -> Iterator[Self]:
        """Create the schema; at the end drop it, also on error, Ctrl-C or SIGTERM."""
        with sigterm_exits():
            try:
                say(f"schema {self.schema} on {redact(self.dsn)}; load average {load_average()}")
                self.create()
                yield self
            finally:
                self.drop()
                say(f"dropped schema {self.schema}")

    def create(self) -> None:
        """The schema and forklift's tables in it."""
        self.app.migrate()

    def drop(self) -> None:
        """Stop what is still running and drop the schema, whatever happened before."""
        try:
            self.stop_all()
        except Exception as exc:  # the schema goes in any case
            say(f"while stopping forklift: {exc}")
        self.app.close()
        self.db.close()
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute("SET lock_timeout = '30s'")
            conn.execute(f"DROP SCHEMA IF EXISTS {self.schema} CASCADE")
        shutil.rmtree(self.logdir, ignore_errors=True)

    def start(self, *args: str) -> ForkliftProcess:
        """Start `python -m forklift ARGS` against this schema."""
        proc = ForkliftProcess(args, self.env, self.logdir)
        self.procs.append(proc)
        return proc

    def stop_all(self) -> None:
        """SIGTERM every process still running, then wait for each (see ForkliftProcess.stop)."""
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.stop()
            except Exception as exc:
                say(f"while stopping forklift (pid {proc.pid}): {exc}")

    def scalar(self, sql: str, params: Sequence[Any] = ()) -> Any:
        """The first value of the first row of `sql`, in which {s} stands for the schema."""
        row = self.db.execute(sql.format(s=self.schema), params).fetchone()
        return None if row is None else row[0]

    def print_logged(self) -> None:
        """Print (the last 30 of) what the stopped processes printed, and bad exit codes.

        For processes started with --log-level WARNING: all they print is a problem.
        """
        lines: list[str] = []
        for proc in self.procs:
            if proc.returncode is None:
                continue
            lines += [f"[pid {proc.pid}] {line}" for line in proc.output().splitlines()]
            if proc.returncode != 0:
                lines.append(f"[pid {proc.pid}] exited with code {proc.returncode}")
        if lines:
            print(f"forklift logged {len(lines)} line(s) at WARNING or above:")
            for line in lines[-30:]:
                print(f"  {line}")
