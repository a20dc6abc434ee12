"""The demo's verdict: a table of what ran, and whether every effect committed exactly once."""

from __future__ import annotations

from dataclasses import dataclass

from rich.table import Table
from rich.text import Text

from forklift.demo.image import RGB
from forklift.demo.progress import plural, swatch


@dataclass(frozen=True)
class Callback:
    """The tile batch's end and its callback's run, as the demo found them."""

    batch_id: int
    outcome: str | None  # the batch's: succeeded, failed (some tile dead), cancelled
    task: str
    job_id: int | None
    runs: int  # committed runs of the callback (its effect rows): 1 when it ran once
    worker_pid: int | None

    @property
    def ran(self) -> str:
        return {0: "never ran", 1: "ran once"}.get(self.runs, f"ran {self.runs} times")


@dataclass(frozen=True)
class Result:
    """What the demo found at its end."""

    tiles: int
    states: dict[str, int]
    wall: float  # supervisor start to the batch's end, seconds
    retries: int  # jobs with a failed attempt behind them
    restarts: int | None  # forklift_worker_restarts_total; None if /metrics was unreadable
    effect_rows: int
    effect_tiles: int  # distinct tiles among the effect rows
    by_worker: dict[int, int]
    supervisor_exit: int
    killed: str  # which worker the demo killed, on which tile, or why none
    callback: Callback

    @property
    def exactly_once(self) -> bool:
        """Every tile has exactly one effect row, every tile's job succeeded, and the
        callback's effect committed once."""
        return (
            self.effect_rows == self.effect_tiles == self.tiles
            and self.states.get("succeeded", 0) == self.tiles
            and self.callback.runs == 1
        )

    @property
    def ok(self) -> bool:
        return self.exactly_once and self.supervisor_exit == 0


def _jobs(states: dict[str, int]) -> str:
    parts = [f"{n} {state}" for state, n in sorted(states.items(), key=lambda s: -s[1]) if n]
    return f"{sum(states.values())} ({', '.join(parts)})"


def summary_table(result: Result, colours: dict[int, RGB]) -> Table:
    verdict = "yes" if result.exactly_once else "no"
    cb = result.callback
    table = Table(
        title="forklift demo",
        caption=f"effects exactly once: {verdict}; callback {cb.ran}",
        caption_style="bold green" if result.exactly_once else "bold red",
        show_header=False,
    )
    table.add_column(justify="right", style="bold")
    table.add_column()
    rate = result.tiles / result.wall if result.wall > 0 else 0.0
    rows: list[tuple[str, str | Text]] = [
        ("jobs", _jobs(result.states)),
        ("wall time", f"{result.wall:.1f} s"),
        ("throughput", f"{rate:.1f} jobs/s"),
        ("killed", result.killed),
        ("retries", str(result.retries)),
        ("worker restarts", "unknown" if result.restarts is None else str(result.restarts)),
    ]
    for pid, colour in colours.items():
        tiles = result.by_worker.get(pid, 0)
        rows.append((f"worker {pid}", Text.assemble(swatch(colour), f" {plural(tiles, 'tile')}")))
    rows += [
        ("effect rows", f"{result.effect_rows} for {result.tiles} tiles "
                        f"({result.effect_tiles} distinct)"),
        ("batch", f"{cb.batch_id}: {result.tiles} jobs, {cb.outcome}; callback job {cb.job_id}"),
        ("callback", f"{cb.task}: {cb.ran} ({plural(cb.runs, 'image row')}), "
                     f"on worker {cb.worker_pid}"),
        ("supervisor exit", f"{result.supervisor_exit} after SIGTERM"),
    ]  # fmt: skip
    for name, value in rows:
        table.add_row(name, value)
    return table
