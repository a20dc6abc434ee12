"""The app of bench.resumable: CPU jobs made of items, each item's body recorded.

Workers load it as `bench.resumable_app:app`; the DSN and schema come from
FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA, and the repository root must be on PYTHONPATH.
The bench registers the same tasks on its own producer App with `register()`.

"crunch" is the job whose redone work bench.resumable measures: `items` bodies of
`spin(iterations)`, looped over three ways (`how`):

- "iterate": `ctx.iterate(range(items))`, the resumable loop;
- "checkpoint": `ctx.checkpoint(next item)` after every body, resuming from
  `ctx.checkpointed`, and deaf to a stop and to ctx.cancelled: a handler that ignores
  the stop until it is killed;
- "plain": a plain `for` from item 0 on every attempt (what a queue without checkpoints
  offers), stopping early, like a well-behaved handler, once ctx.cancelled is set.

Every body, as it finishes, inserts (run, item, CPU seconds) into `<schema>.bodies` on a
connection of the worker's own, outside any transaction of the job's, so a body is
recorded even when its attempt then dies: a run is one call of the handler (a token of
its own), and an item recorded by two runs was done twice. The connection is made
again when the database ends it, and the insert repeated (a (run, item) recorded
already is not recorded twice).
"""

from __future__ import annotations

import secrets
import statistics
import threading
import time
from typing import Any

import psycopg

import forklift
from bench.cpu_app import spin

HOWS = ("iterate", "checkpoint", "plain")
# No job of the bench's may run out of attempts or crashes while it is being killed, nor
# wait out a retry delay before it runs again.
PATIENT: dict[str, Any] = {
    "max_attempts": 1000,
    "max_crashes": 1000,
    "backoff": forklift.Backoff(base=0.0, factor=1.0, jitter=0.0),
}
# Seconds of each segment of "burn": this VM's speed moves by several per cent from one
# half second to the next; segments this short see the same machine, A or B.
SEGMENT = 0.02
# The order of a round's segments, every other round the other way about: a segment's
# place in a round has an effect of its own (a few tenths of a per cent here).
ABBA = ("without", "with", "with", "without")
BAAB = ("with", "without", "without", "with")
RECONNECT_FOR = 60.0  # seconds a body's record waits for the database to come back

BODIES = """
CREATE TABLE IF NOT EXISTS "{schema}".bodies (
    n      bigint GENERATED ALWAYS AS IDENTITY,
    job_id bigint NOT NULL,
    run    text NOT NULL,
    item   integer NOT NULL,
    cpu    double precision NOT NULL,
    at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (run, item)
)
"""
RECORD = (
    'INSERT INTO "{schema}".bodies (job_id, run, item, cpu) VALUES (%s, %s, %s, %s)'
    " ON CONFLICT (run, item) DO NOTHING"
)


class Recorder:
    """This process's connection for the bodies' records, opened on first use (after
    the fork), opened again when the database ended it."""

    def __init__(self, app: forklift.App) -> None:
        self.app = app
        self.conn: psycopg.Connection[Any] | None = None

    def record(self, job_id: int, run: str, item: int, cpu: float) -> None:
        statement = RECORD.format(schema=self.app.schema)
        deadline = time.monotonic() + RECONNECT_FOR
        while True:
            try:
                if self.conn is None or self.conn.closed:
                    self.conn = psycopg.connect(self.app.dsn, autocommit=True, connect_timeout=2)
                self.conn.execute(statement, (job_id, run, item, cpu))
                return
            except psycopg.OperationalError:
                if self.conn is not None:
                    self.conn.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


class Run:
    """One call of the handler: its token, and its bodies, each timed and recorded."""

    def __init__(self, ctx: forklift.JobContext, recorder: Recorder, iterations: int) -> None:
        self.ctx = ctx
        self.recorder = recorder
        self.iterations = iterations
        self.token = secrets.token_hex(8)

    def body(self, item: int) -> None:
        began = time.thread_time()
        spin(self.iterations)
        self.recorder.record(self.ctx.job_id, self.token, item, time.thread_time() - began)


def writer_cpu() -> float:
    """CPU seconds this worker's progress writer thread has used (0 if it has none)."""
    for thread in threading.enumerate():
        if thread.name == "forklift-progress" and thread.native_id is not None:
            with open(f"/proc/self/task/{thread.native_id}/schedstat") as stat:
                return int(stat.read().split()[0]) / 1e9  # nanoseconds on a CPU
    return 0.0


def calibrated(seconds: float) -> int:
    """Iterations of `spin` that take about `seconds` in this process: scaled from a short
    call, then from the median of five calls of about `seconds`."""
    warm = time.perf_counter() + 0.5  # a core idle until now may run slower at first
    while time.perf_counter() < warm:
        spin(10_000)
    iterations = 20_000
    for rounds in (1, 5):
        timed = []
        for _ in range(rounds):
            began = time.perf_counter()
            spin(iterations)
            timed.append(time.perf_counter() - began)
        iterations = max(1, round(iterations * seconds / statistics.median(timed)))
    return iterations


def loop(run: Run, items: int, how: str) -> int:
    """The bodies of one run of "crunch", looped over as `how` says; how many it did."""
    ctx = run.ctx
    done = 0
    if how == "iterate":
        for item in ctx.iterate(range(items)):
            run.body(item)
            done += 1
    elif how == "checkpoint":
        for item in range(ctx.checkpointed or 0, items):
            run.body(item)
            ctx.checkpoint(item + 1)
            done += 1
    else:
        for item in range(items):
            if ctx.cancelled:
                break
            run.body(item)
            done += 1
    return done


def burn_rounds(ctx: forklift.JobContext, seconds: float, item: float) -> dict[str, float]:
    """About 2 x `seconds` of items of `item` seconds (calibrated here) in rounds of four
    segments of SEGMENT seconds, two of each (ABBA, BAAB) calling `ctx.checkpoint(next
    item)` after each item. Returns the items and wall seconds of each kind, the median
    round's (with / without) - 1, and the CPU seconds the worker's progress writer
    (which writes the checkpoints) used meanwhile."""
    iterations = calibrated(item)
    per_segment = max(1, round(SEGMENT / item))
    rounds = max(1, round(seconds / SEGMENT / 2))
    walls = {"without": 0.0, "with": 0.0}
    ratios = []
    writer = writer_cpu()
    done = 0
    for r in range(rounds):
        took = {"without": 0.0, "with": 0.0}
        for kind in ABBA if r % 2 == 0 else BAAB:
            began = time.perf_counter()
            for _ in range(per_segment):
                spin(iterations)
                done += 1
                if kind == "with":
                    ctx.checkpoint(done)
            took[kind] += time.perf_counter() - began
        ratios.append(took["with"] / took["without"])
        walls = {k: walls[k] + took[k] for k in walls}
    return {
        "items": rounds * 2 * per_segment,
        **walls,
        "added": statistics.median(ratios) - 1,
        "writer": writer_cpu() - writer,
    }


def register(app: forklift.App) -> forklift.App:
    """Register the benchmark's tasks on `app`; return it."""
    recorder = Recorder(app)

    @app.task(name="crunch", **PATIENT)
    def crunch(ctx: forklift.JobContext, *, items: int, iterations: int, how: str) -> int:
        """`items` bodies of `spin(iterations)`, looped over as `how` says (see the
        module's doc); returns the number of bodies this run did."""
        return loop(Run(ctx, recorder, iterations), items, how)

    @app.task(name="burn", **PATIENT)
    def burn(ctx: forklift.JobContext, *, seconds: float, item: float) -> dict[str, float]:
        """About 2 x `seconds` of items of `item` seconds, half of them checkpointed
        (see `burn_rounds`)."""
        return burn_rounds(ctx, seconds, item)

    @app.task(name="loops", **PATIENT)
    def loops(ctx: forklift.JobContext, *, n: int, rounds: int) -> dict[str, list[float]]:
        """A plain `for` over range(n) and `ctx.iterate(range(n))`, each with an empty
        body, alternately `rounds` times; the seconds of each loop."""
        plain: list[float] = []
        iterate: list[float] = []
        for r in range(rounds):
            began = time.perf_counter()
            for _ in range(n):
                pass
            plain.append(time.perf_counter() - began)
            began = time.perf_counter()
            for _ in ctx.iterate(range(n), name=f"round {r}"):
                pass
            iterate.append(time.perf_counter() - began)
        return {"plain": plain, "iterate": iterate}

    return app


def create_tables(app: forklift.App) -> None:
    """The bodies' table, in the app's schema."""
    with psycopg.connect(app.dsn, autocommit=True) as conn:
        conn.execute(BODIES.format(schema=app.schema))


app = register(forklift.App())
