"""The demo's app: one job per tile of a Mandelbrot image, rendered in pure Python.

`forklift demo` runs it with `forklift run forklift.demo.mandelbrot:app`; the database
and schema come from FORKLIFT_DATABASE_URL and FORKLIFT_SCHEMA. It lives in the package
so the demo works from an installed wheel, not only from a checkout.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import forklift
from forklift import _sql

TASK = "render_tile"
TILE = 32  # pixels per tile side
MAX_ITER = 200
SAMPLES = 5  # per pixel side: 5x5 points averaged, so edges are smooth (and it is real work)
VIEW_WIDTH = 3.5  # the complex plane's width in view, centred on -0.75 + 0i

app = forklift.App()


@dataclass(frozen=True)
class Tile:
    """One tile of a `width` x `height` image: its number and pixel rectangle."""

    index: int
    x: int
    y: int
    w: int
    h: int


def tiles(width: int, height: int) -> list[Tile]:
    """The image cut into TILE x TILE tiles (smaller at the right and bottom edges)."""
    return [
        Tile(i, x, y, min(TILE, width - x), min(TILE, height - y))
        for i, (y, x) in enumerate(
            (y, x) for y in range(0, height, TILE) for x in range(0, width, TILE)
        )
    ]


def job_args(tile: Tile, width: int, height: int) -> dict[str, int]:
    """The keyword arguments of the render_tile job for `tile`."""
    return dict(tile=tile.index, x=tile.x, y=tile.y, w=tile.w, h=tile.h, width=width, height=height)


def render(tile: Tile, width: int, height: int) -> bytes:
    """The tile's pixels, one byte each, row by row: 0 inside the set, 64 far outside it,
    rising to 255 at its edge (see forklift.demo.image.tint); each the mean of its
    SAMPLES x SAMPLES points, so the edge is smooth."""
    scale = VIEW_WIDTH / width
    left, top = -0.75 - width / 2 * scale, -height / 2 * scale
    offsets = [(k + 0.5) / SAMPLES * scale for k in range(SAMPLES)]
    out = bytearray()
    for py in range(tile.y, tile.y + tile.h):
        for px in range(tile.x, tile.x + tile.w):
            total = 0.0
            for dy in offsets:
                for dx in offsets:
                    total += _escape(complex(left + px * scale + dx, top + py * scale + dy))
            out.append(round(total / SAMPLES**2))
    return bytes(out)


def _escape(c: complex) -> float:
    """0 if `c` stays bounded for MAX_ITER steps, else 64..255 by how long it took to escape."""
    z = 0j
    for n in range(MAX_ITER):
        z = z * z + c
        if abs(z) > 2.0:
            return 64 + 191 * math.sqrt(n / MAX_ITER)
    return 0.0


@app.task(name=TASK, max_attempts=3, timeout=60.0, backoff=forklift.Backoff(base=0.2))
def render_tile(
    ctx: forklift.JobContext, *, tile: int, x: int, y: int, w: int, h: int, width: int, height: int
) -> None:
    """Render one tile, then store it in the job's completion transaction: the tile row
    commits exactly when the job does, so a retried job never leaves two."""
    pixels = render(Tile(tile, x, y, w, h), width, height)
    with ctx.transaction() as conn:
        conn.execute(
            _sql.load("forklift.demo", "queries.sql", app.schema)["tile_insert"],
            {"tile": tile, "worker_pid": os.getpid(), "attempt": ctx.attempt, "pixels": pixels},
        )
