"""The demo's progress: a live view on a terminal, a few plain lines anywhere else."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from forklift.demo.database import Snapshot
from forklift.demo.image import RGB, colours

EVENTS_SHOWN = 8


@dataclass
class Frame:
    """What is true now: the database's snapshot and what the demo knows of its workers."""

    snapshot: Snapshot
    total: int
    elapsed: float
    workers: list[int]  # live worker pids
    killed: int | None = None
    events: list[str] = field(default_factory=list)  # new since the previous frame

    @property
    def rate(self) -> float:
        return self.snapshot.finished / self.elapsed if self.elapsed > 0 else 0.0


class Palette:
    """One colour per worker pid ever seen, the same in the live view and the image."""

    def __init__(self) -> None:
        self.pids: set[int] = set()

    def see(self, pids: list[int]) -> None:
        self.pids.update(pids)

    def colours(self) -> dict[int, RGB]:
        return colours(self.pids)


def plural(n: int, one: str, many: str = "") -> str:
    return f"{n} {one}" if n == 1 else f"{n} {many or one + 's'}"


def swatch(colour: RGB) -> Text:
    return Text("██", style=f"rgb({colour[0]},{colour[1]},{colour[2]})")


def worker_table(frame: Frame, palette: Palette) -> Table:
    """Each worker process: its colour, tiles rendered, what it does now."""
    table = Table(box=None, padding=(0, 1), show_edge=False)
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("", "left"), ("worker", "right"), ("tiles", "right"), ("now", "left"),
    )  # fmt: skip
    for name, justify in columns:
        table.add_column(name, justify=justify)
    running = {job.pid: job.tile for job in frame.snapshot.running}
    for pid, colour in palette.colours().items():
        if pid == frame.killed:
            now = "killed (SIGKILL)"
        elif pid in running:
            now = f"rendering tile {running[pid]}"
        else:
            now = "idle" if pid in frame.workers else "gone"
        table.add_row(swatch(colour), str(pid), str(frame.snapshot.by_worker.get(pid, 0)), now)
    return table


def status_line(frame: Frame) -> str:
    return (
        f"{frame.snapshot.finished}/{frame.total} tiles  {frame.rate:.1f} jobs/s  "
        f"{plural(len(frame.workers), 'worker')}  "
        f"{plural(len(frame.snapshot.charged), 'retry', 'retries')}"
    )


class LiveView:
    """A progress bar, the workers and the latest events, redrawn on every frame."""

    def __init__(self, console: Console, palette: Palette) -> None:
        self.palette = palette
        self.events: deque[str] = deque(maxlen=EVENTS_SHOWN)
        self.live = Live(console=console, auto_refresh=False)
        self.live.start()

    def show(self, frame: Frame) -> None:
        self.events.extend(f"{frame.elapsed:5.1f}s  {e}" for e in frame.events)
        self.live.update(self.render(frame), refresh=True)

    def render(self, frame: Frame) -> RenderableType:
        bar = Table.grid(padding=(0, 2))
        bar.add_row(
            ProgressBar(total=frame.total, completed=frame.snapshot.finished, width=40),
            Text(status_line(frame)),
        )
        return Group(
            bar, Text(""), worker_table(frame, self.palette), Text(""), *map(Text, self.events)
        )

    def close(self) -> None:
        self.live.stop()


class PlainView:
    """For a pipe or a file: every event as a line, and progress at each quarter."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.quarter = 0

    def show(self, frame: Frame) -> None:
        for event in frame.events:
            self.console.print(Text(f"{frame.elapsed:5.1f}s  {event}"), soft_wrap=True)
        quarter = 4 * frame.snapshot.finished // max(frame.total, 1)
        if quarter > self.quarter:
            self.quarter = quarter
            tiles = ", ".join(
                f"{n} by {pid}" for pid, n in sorted(frame.snapshot.by_worker.items())
            )
            line = f"{frame.elapsed:5.1f}s  {status_line(frame)}  (tiles: {tiles})"
            self.console.print(Text(line), soft_wrap=True)

    def close(self) -> None:
        pass


def make_view(console: Console, palette: Palette) -> LiveView | PlainView:
    return LiveView(console, palette) if console.is_terminal else PlainView(console)
