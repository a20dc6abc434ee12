"""A workflow's graph as server-rendered SVG: the geometry here (a box per step, in a
column per level and a row per place in it; a line per edge), the markup in the template
(_workflow.html), which escapes every name as it escapes the rest of the page. The
layout itself (levels, which steps are drawn) is forklift.shown.workflowview's, which
`forklift workflows show` prints."""

from __future__ import annotations

from dataclasses import dataclass

from forklift.shown import output
from forklift.shown.workflowview import Layout, StepLine

BOX_WIDTH = 190
BOX_HEIGHT = 42
COLUMN_GAP = 60  # between levels: room for the edges' curves
ROW_GAP = 12
MARGIN = 8
NAME_CHARS = 26  # of a step's name inside its box (its <title> has it whole)
EDGES_DRAWN = 2000  # a fan-in of thousands would be ink, not information

# Each state's box (fill, then outline and text): the colours of the dashboard's state
# pills (dashboard.css), so a step reads the same in the graph as everywhere else.
COLOURS = {
    "blocked": ("#fbefff", "#8250df"),
    "ready": ("#eaeef2", "#424a53"),
    "running": ("#ddf4ff", "#0969da"),
    "succeeded": ("#dafbe1", "#1a7f37"),
    "dead": ("#ffebe9", "#cf222e"),
    "cancelled": ("#eaeef2", "#6e7781"),
}
UNKNOWN = ("#ffffff", "#5b6573")


@dataclass(frozen=True)
class Box:
    """A step's box: where it is, its colours, and what it says."""

    step: StepLine
    x: int
    y: int
    fill: str
    ink: str
    name: str  # cut to fit; the step's whole name is in `title`
    title: str  # its tooltip: the step's whole line

    @property
    def width(self) -> int:
        return BOX_WIDTH

    @property
    def height(self) -> int:
        return BOX_HEIGHT


@dataclass(frozen=True)
class Edge:
    """A line from an upstream step's box (its right side) to its dependent's (left)."""

    path: str  # an SVG path: a curve between the two boxes
    ignores_failure: bool  # drawn dashed


@dataclass(frozen=True)
class Graph:
    width: int
    height: int
    boxes: list[Box]
    edges: list[Edge]
    edges_left: int  # edges not drawn (past EDGES_DRAWN)


def _box(step: StepLine, column: int, row: int) -> Box:
    fill, ink = COLOURS.get(step.state, UNKNOWN)
    return Box(
        step,
        MARGIN + column * (BOX_WIDTH + COLUMN_GAP),
        MARGIN + row * (BOX_HEIGHT + ROW_GAP),
        fill,
        ink,
        output.cell(step.name, NAME_CHARS),
        step.text(),
    )


def _edge(up: Box, down: Box, ignores_failure: bool) -> Edge:
    x1, y1 = up.x + BOX_WIDTH, up.y + BOX_HEIGHT // 2
    x2, y2 = down.x, down.y + BOX_HEIGHT // 2
    bend = max(COLUMN_GAP // 2, (x2 - x1) // 3)
    return Edge(f"M{x1},{y1} C{x1 + bend},{y1} {x2 - bend},{y2} {x2},{y2}", ignores_failure)


def graph(shape: Layout) -> Graph:
    """The boxes and edges of `shape`'s steps (those it lays out, only)."""
    boxes = [
        _box(step, c, r) for c, column in enumerate(shape.columns) for r, step in enumerate(column)
    ]
    by_id = {b.step.id: b for b in boxes}
    edges: list[Edge] = []
    left = 0
    for down in boxes:
        for up in down.step.after:
            if up not in by_id:
                continue  # a step not laid out: its line says so
            if len(edges) == EDGES_DRAWN:
                left += 1
                continue
            edges.append(_edge(by_id[up], down, up in down.step.ignoring))
    columns = max(1, len(shape.columns))
    rows = max((len(c) for c in shape.columns), default=1)
    return Graph(
        2 * MARGIN + columns * BOX_WIDTH + (columns - 1) * COLUMN_GAP,
        2 * MARGIN + rows * BOX_HEIGHT + (rows - 1) * ROW_GAP,
        boxes,
        edges,
        left,
    )
