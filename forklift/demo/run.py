"""`forklift demo` from start to end: database, a batch of jobs, supervisor, a kill, the
batch's end and its callback (which writes the image), the verdict."""

from __future__ import annotations

import shutil
import signal
import tempfile
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.text import Text

from forklift.app import App
from forklift.batch import Batch, BatchStatus
from forklift.cli.errors import Exit
from forklift.demo.database import DemoStore, Running, Snapshot, named_dsn, open_place
from forklift.demo.fractal import tiles
from forklift.demo.interrupts import Interrupted, Interrupts
from forklift.demo.launch import DemoError, Supervisor
from forklift.demo.mandelbrot import ASSEMBLE, TASK, job_args
from forklift.demo.progress import Frame, LiveView, Palette, PlainView, make_view
from forklift.demo.story import Story
from forklift.demo.summary import Callback, Result, summary_table
from forklift.errors import JobCancelled, JobFailed
from forklift.testing import calls_handler, process_state

POLL = 0.2  # seconds between looks at the database
END_TIMEOUT = 30.0  # for the batch to finish once its last tile ended (a sweep: 1 s)
CALLBACK_TIMEOUT = 90.0  # for the callback's result (its task's timeout is 60 s)


@dataclass(frozen=True)
class Options:
    dsn: str | None
    workers: int
    width: int
    height: int
    kill: bool
    out: Path


def run(options: Options, console: Console | None = None) -> int:
    """Run the demo; 0 if every effect (each tile's, the callback's) committed exactly once,
    else 1; 130 if interrupted by SIGINT or SIGTERM (everything it started is stopped
    first)."""
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


class Watcher:
    """The progress view and what feeds it: a look at the tiles, the supervisor's workers
    and its log per frame, each event told once."""

    def __init__(
        self,
        supervisor: Supervisor,
        store: DemoStore,
        batch_id: int,
        view: LiveView | PlainView,
        palette: Palette,
        *,
        tiles: int,
        workers: int,
        started: float,
    ) -> None:
        self.supervisor = supervisor
        self.store = store
        self.batch_id = batch_id
        self.view = view
        self.palette = palette
        self.tiles = tiles
        self.story = Story(workers)
        self.started = started  # the supervisor's start
        self.killed: int | None = None  # the pid of the worker the demo killed

    def look(self) -> tuple[Snapshot, list[int], list[str]]:
        """The tiles' snapshot, the live worker pids, and the events since the last look."""
        self.supervisor.check_alive()
        snapshot = self.store.snapshot(self.batch_id)
        workers = self.supervisor.workers()
        self.palette.see([*workers, *snapshot.by_worker])
        return snapshot, workers, self.story.news(snapshot, self.supervisor.log.events())

    def show(self, snapshot: Snapshot, workers: list[int], events: list[str]) -> None:
        elapsed = time.monotonic() - self.started
        self.view.show(Frame(snapshot, self.tiles, elapsed, workers, self.killed, events))

    def tell(self, event: str) -> None:
        """One more frame, with `event` after whatever else happened."""
        snapshot, workers, events = self.look()
        self.show(snapshot, workers, [*events, event])


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
        producer = App(place.dsn, schema=place.schema)
        self.stack.callback(producer.close)
        batch = self.enqueue(producer)
        logs = Path(tempfile.mkdtemp(prefix="forklift-demo-"))
        self.stack.callback(shutil.rmtree, logs, ignore_errors=True)
        started = time.monotonic()
        supervisor = Supervisor.start(
            place, o.workers, logs / "supervisor.log", self.stack, self.interrupts
        )
        self.say(f"supervisor: {supervisor.command} (pid {supervisor.proc.pid})")
        view = make_view(self.console, self.palette)
        self.stack.callback(view.close)
        watcher = Watcher(
            supervisor, store, batch.id, view, self.palette,
            tiles=len(self.layout), workers=o.workers, started=started,
        )  # fmt: skip
        self.watch(watcher)
        wall, callback, image = self.finish(watcher, batch, producer)
        watcher.view.close()
        restarts = supervisor.restarts()
        result = self.result(store, wall, restarts, supervisor.stop(), callback)
        self.console.print(summary_table(result, self.palette.colours()))
        self.say(image_text(self.options, image))
        return Exit.OK if result.ok else Exit.ERROR

    def enqueue(self, producer: App) -> Batch:
        """Every tile as a job of one batch (in one transaction, by COPY); its callback,
        assemble, writes the image once every tile's job has ended."""
        w, h = self.options.width, self.options.height
        return producer.enqueue_batch(
            [(TASK, job_args(t, w, h)) for t in self.layout],
            on_complete=ASSEMBLE,
            on_complete_args={"out": str(self.options.out.resolve()), "width": w, "height": h},
        )

    def watch(self, watcher: Watcher) -> None:
        """Show progress until every tile's job has ended; kill a busy worker halfway."""
        total = len(self.layout)
        while True:
            snapshot, workers, events = watcher.look()
            if self.options.kill and self.killed is None and snapshot.finished >= total / 2:
                with self.interrupts.shielded():  # never leave a worker SIGSTOPped
                    self.killed = kill_busy_worker(
                        watcher.supervisor, watcher.store, snapshot.running
                    )
                if self.killed is not None:
                    watcher.killed = self.killed.pid
                    events.append(f"killed {self.killed_text()}")
            watcher.show(snapshot, workers, events)
            if snapshot.finished >= total:
                return
            time.sleep(POLL)

    def finish(
        self, watcher: Watcher, batch: Batch, producer: App
    ) -> tuple[float, Callback, dict[str, Any]]:
        """The batch's end (batch.wait's answer), then its callback's (app.result's):
        seconds from the supervisor's start to the batch's end, the callback's run, and
        what it wrote."""
        status = batch_end(batch, watcher.supervisor)
        ended = time.monotonic()
        watcher.tell(
            f"batch {batch.id} finished ({status.outcome}): its callback, {ASSEMBLE}, "
            f"is job {status.callback_job_id}"
        )
        image = assembled(producer, status, watcher.supervisor)
        callback = Callback(
            batch.id, status.outcome, ASSEMBLE, status.callback_job_id,
            watcher.store.image_runs(batch.id), image.get("worker_pid"),
        )  # fmt: skip
        watcher.tell(
            f"callback job {callback.job_id} assembled the image on worker {callback.worker_pid}"
        )
        return ended - watcher.started, callback, image

    def result(
        self,
        store: DemoStore,
        wall: float,
        restarts: int | None,
        supervisor_exit: int,
        callback: Callback,
    ) -> Result:
        final = store.snapshot(callback.batch_id)
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
            callback=callback,
        )

    def killed_text(self) -> str:
        if self.killed is not None:
            return f"worker {self.killed.pid} while it rendered tile {self.killed.tile}"
        if not self.options.kill:
            return "none (--no-kill)"
        return "none (no tile was being rendered past halfway)"


def batch_end(batch: Batch, supervisor: Supervisor) -> BatchStatus:
    """The batch's own word that it finished (every one of its jobs has ended by now)."""
    try:
        return batch.wait(timeout=END_TIMEOUT)
    except TimeoutError:
        supervisor.check_alive()  # the likelier story, if it is the one
        raise DemoError(
            f"batch {batch.id} did not finish within {END_TIMEOUT:g} s of its last job"
        ) from None


def assembled(producer: App, status: BatchStatus, supervisor: Supervisor) -> dict[str, Any]:
    """The callback's result (what it wrote), once it succeeded."""
    job_id = status.callback_job_id
    if job_id is None:
        raise DemoError(f"batch {status.id} finished without enqueuing its callback")
    try:
        made = producer.result(job_id, timeout=CALLBACK_TIMEOUT)
    except TimeoutError:
        supervisor.check_alive()
        raise DemoError(
            f"the callback (job {job_id}) did not finish within {CALLBACK_TIMEOUT:g} s"
        ) from None
    except (JobFailed, JobCancelled) as exc:
        raise DemoError(f"the callback could not assemble the image: {exc}") from None
    if not isinstance(made, dict):
        raise DemoError(f"the callback (job {job_id}) returned {made!r}, not what it wrote")
    return made


def image_text(options: Options, image: dict[str, Any]) -> str:
    w, h = options.width, options.height
    return (
        f"image: {image.get('path')} ({w}x{h} and a caption strip below, "
        f"{image.get('width')}x{image.get('height')} in all, written by the batch's callback; "
        "each tile tinted by the worker process that rendered it, a red frame around a tile "
        "rendered again)"
    )


def kill_busy_worker(
    supervisor: Supervisor, store: DemoStore, running: Sequence[Running]
) -> Running | None:
    """SIGKILL the worker of the first of `running` whose handler runs, so it dies
    mid-render (None: none does now; the caller looks again later).

    The worker is SIGSTOPped first, so that what is looked at stays true until the kill:
    `ps` names the job whose handler it calls (a job claimed ahead, not started yet, would
    be released uncharged), no statement of its is in flight at the server (a commit
    under way could still land), and the job is still its own. Otherwise it is let go
    and the next one is tried.
    """
    for job in running:
        if not supervisor.signal_worker(job.pid, signal.SIGSTOP):
            continue
        if stopped(job.pid) and calls_handler(job.pid, job.job_id) and store.quiet_and_held(job):
            supervisor.signal_worker(job.pid, signal.SIGKILL)
            return job
        supervisor.signal_worker(job.pid, signal.SIGCONT)
    return None


def stopped(pid: int, timeout: float = 1.0) -> bool:
    """Whether `pid` is stopped (state T) within `timeout` seconds of its SIGSTOP."""
    deadline = time.monotonic() + timeout
    while (state := process_state(pid)) is not None and time.monotonic() < deadline:
        if state == "T":
            return True
        time.sleep(0.001)
    return False
