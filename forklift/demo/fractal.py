"""The demo's picture as numbers: a Mandelbrot image cut into tiles, rendered in pure Python."""

from __future__ import annotations

import math
from dataclasses import dataclass

TILE = 32  # pixels per tile side
MAX_ITER = 200
SAMPLES = 5  # per pixel side: 5x5 points averaged, so edges are smooth (and it is real work)
VIEW_WIDTH = 3.5  # the complex plane's width in view, centred on -0.75 + 0i


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
