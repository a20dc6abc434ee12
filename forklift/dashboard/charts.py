"""The overview's charts as server-rendered SVG: the geometry here, the markup in the
template (no script, no chart library, nothing for the browser to build)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC

from forklift.admin.rows import FinishedMinute

WIDTH = 600  # the viewBox: the SVG scales to its box
HEIGHT = 120
GAP = 1  # between bars


@dataclass(frozen=True)
class Bar:
    x: float
    y: float
    width: float
    height: float
    label: str  # its tooltip: `12:03Z: 42`


@dataclass(frozen=True)
class Chart:
    """One series as bars, a bar per minute, scaled to its largest minute."""

    title: str
    css: str  # the bars' class: done, dead
    bars: list[Bar]
    peak: int  # the top of the scale
    total: int
    last: int  # the current (partial) minute
    width: int = WIDTH
    height: int = HEIGHT


def _nice(peak: int) -> int:
    """The top of the scale: `peak` rounded up to 1, 2 or 5 times a power of ten."""
    step = 1
    while True:
        for m in (1, 2, 5):
            if peak <= m * step:
                return m * step
        step *= 10


def chart(title: str, css: str, minutes: list[FinishedMinute], dead: bool) -> Chart:
    values = [m.dead if dead else m.succeeded for m in minutes]
    peak = _nice(max(values, default=0))
    slot = WIDTH / max(1, len(values))
    bars = []
    for i, (minute, value) in enumerate(zip(minutes, values, strict=True)):
        height = HEIGHT * value / peak
        bars.append(
            Bar(
                round(i * slot, 2),
                round(HEIGHT - height, 2),
                round(max(0.5, slot - GAP), 2),
                round(height, 2),
                f"{minute.at.astimezone(UTC):%H:%M}Z: {value}",
            )
        )
    return Chart(title, css, bars, peak, sum(values), values[-1] if values else 0)


def charts(minutes: list[FinishedMinute]) -> list[Chart]:
    """Done and dead per minute."""
    return [
        chart("done per minute", "done", minutes, dead=False),
        chart("dead per minute", "dead", minutes, dead=True),
    ]
