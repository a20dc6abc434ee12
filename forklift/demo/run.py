"""`forklift demo` from start to end: database, jobs, supervisor, a kill, the verdict, the image."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.text import Text

from forklift.app import App, JobSpec
from forklift.cli.errors import Exit
from forklift.demo.database import DemoStore, Place, Running, Snapshot, named_dsn, open_place
from forklift.demo.fractal import tiles
from forklift.demo.image import compose
from forklift.demo.interrupts import Interrupted, Interrupts
from forklift.demo.launch import Supervisor
from forklift.demo.mandelbrot import TASK, job_args
from forklift.demo.png import write_png
from forklift.demo.progress import Frame, Palette, make_view
from forklift.demo.story import Story
from forklift.demo.summary import Result, summary_table

POLL = 0.2  # seconds between looks at the database


@dataclass(frozen=True)
class Options:
    dsn: str | None
    workers: int
    width: int
    height: int
    kill: bool
    out: Path


def run(options: Options, console: Console | None = None) -> int:
    """Run the demo; 0 if every tile's effect committed exactly once, else 1; 130 if
    interrupted by SIGINT or SIGTERM (everything it started is stopped first)."""
    console = console or Console()
    with Interrupts() as interrupts:
        try:
            with ExitStack() as stack:
                return Demo(options, console, interrupts, stack).run()
        except Interrupted as exc:
            console.print(
                Text(
                    f"forklift demo: interrupted by {exc}: the supervisor and its workers "
                    "are stopped and the demo's database is gone"
                ),
                soft_wrap=True,
            )
            return Exit.INTERRUPTED


class Demo:
    """One run of the demo; everything it starts is stopped by `stack`."""

    def __init__(
        self, options: Options, console: Console, interrupts: Interrupts, stack: ExitStack
    ) -> None:
        self.options = options
        self.console = console
        self.interrupts = interrupts
        self.stack = stack
        self.layout = tiles(options.width, options.height)
        self.palette = Palette()
        self.killed: Running | None = None

    def say(self, text: str) -> None:
        self.console.print(Text(text), soft_wrap=True)

    def run(self) -> int:
        o = self.options
        place = open_place(named_dsn(o.dsn), self.stack, self.interrupts)
        self.say(
            f"forklift demo: {len(self.layout)} tiles of a {o.width}x{o.height} Mandelbrot, "
            f"{o.workers} worker processes, on {place.where}"
        )
        store = self.stack.enter_context(DemoStore(place.dsn, place.schema))
        self.enqueue(place)
        logs = Path(tempfile.mkdtemp(prefix="forklift-demo-"))
        self.stack.callback(shutil.rmtree, logs, ignore_errors=True)
        started = time.monotonic()
        supervisor = Supervisor.start(
            place, o.workers, logs / "supervisor.log", self.stack, self.interrupts
        )
        self.say(f"supervisor: {supervisor.command} (pid {supervisor.proc.pid})")
        self.watch(supervisor, store, started)
        wall = time.monotonic() - started
        restarts = supervisor.restarts()
        code = supervisor.stop()
        result = self.result(store, wall, restarts, code)
        self.console.print(summary_table(result, self.palette.colours()))
        self.write_image(store)
        return Exit.OK if result.ok else Exit.ERROR

    def enqueue(self, place: Place) -> None:
        """Every tile as a job, in one COPY, each with its own idempotency key."""
        producer = App(place.dsn, schema=place.schema)
        w, h = self.options.width, self.options.height
        try:
            producer.enqueue_many(
                JobSpec(TASK, job_args(t, w, h), idempotency_key=f"tile-{t.index}")
                for t in self.layout
            )
        finally:
            producer.close()

    def watch(self, supervisor: Supervisor, store: DemoStore, started: float) -> None:
        """Show progress until every job is finished; kill a busy worker halfway."""
        story = Story(self.options.workers)
        view = make_view(self.console, self.palette)
        self.stack.callback(view.close)
        total = len(self.layout)
        while True:
            supervisor.check_alive()
            snapshot = store.snapshot()
            workers = supervisor.workers()
            self.palette.see([*workers, *snapshot.by_worker])
            events = story.news(snapshot, supervisor.log.events())
            if self.options.kill and self.killed is None and snapshot.finished >= total / 2:
                with self.interrupts.shielded():  # never leave a worker SIGSTOPped
                    self.killed = kill_busy_worker(supervisor, store, snapshot)
                if self.killed is not None:
                    events.append(f"killed {self.killed_text()}")
            killed = self.killed.pid if self.killed else None
            elapsed = time.monotonic() - started
            view.show(Frame(snapshot, total, elapsed, workers, killed, events))
            if snapshot.finished >= total:
                view.close()
                return
            time.sleep(POLL)

    def result(
        self, store: DemoStore, wall: float, restarts: int | None, supervisor_exit: int
    ) -> Result:
        final = store.snapshot()
        self.palette.see(list(final.by_worker))
        rows, distinct = store.effect_counts()
        return Result(
            tiles=len(self.layout),
            states=final.states,
            wall=wall,
            retries=len(final.charged),
            restarts=restarts,
            effect_rows=rows,
            effect_tiles=distinct,
            by_worker=final.by_worker,
            supervisor_exit=supervisor_exit,
            killed=self.killed_text(),
        )

    def killed_text(self) -> str:
        if self.killed is not None:
            return f"worker {self.killed.pid} while it rendered tile {self.killed.tile}"
        if not self.options.kill:
            return "none (--no-kill)"
        return "none (no tile was being rendered past halfway)"

    def write_image(self, store: DemoStore) -> None:
        w, h, out = self.options.width, self.options.height, self.options.out
        write_png(out, w, h, compose(w, h, self.layout, store.rendered(), self.palette.colours()))
        self.say(
            f"image: {out.resolve()} ({w}x{h}; each tile tinted by the worker process that "
            "rendered it, a red frame around a tile rendered again)"
        )


def kill_busy_worker(
    supervisor: Supervisor, store: DemoStore, snapshot: Snapshot
) -> Running | None:
    """SIGKILL the worker of the most recently started tile, so it dies mid-render.

    It is SIGSTOPped first: stopped, it cannot finish the tile between the look at its
    job and the kill (if it already had, it is let go and the next one is tried).
    """
    for job in snapshot.running:
        if not supervisor.signal_worker(job.pid, signal.SIGSTOP):
            continue
        if store.held_by(job):
            supervisor.signal_worker(job.pid, signal.SIGKILL)
            return job
        supervisor.signal_worker(job.pid, signal.SIGCONT)
    return None
