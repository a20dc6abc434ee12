"""The demo's picture: every tile tinted by the worker process that rendered it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from forklift.demo.fractal import Tile

RGB = tuple[int, int, int]

# Distinct, fairly light hues (none of them red: red frames the re-rendered tiles).
PALETTE: tuple[RGB, ...] = (
    (66, 133, 244),
    (255, 167, 38),
    (67, 160, 71),
    (171, 71, 188),
    (0, 172, 193),
    (253, 216, 53),
    (240, 98, 146),
    (141, 110, 99),
)
FRAME: RGB = (229, 57, 53)
MISSING: RGB = (40, 40, 40)
BLACK: RGB = (0, 0, 0)
WHITE: RGB = (255, 255, 255)
INSIDE = 0.22  # how much of its worker's colour a pixel inside the set keeps
FAR = 64  # the pixel value of points far outside the set (forklift.demo.fractal.render)


@dataclass(frozen=True)
class RenderedTile:
    """One tile effect as stored: which worker rendered it, on which attempt."""

    tile: int
    worker_pid: int
    attempt: int
    pixels: bytes


def colours(pids: Iterable[int]) -> dict[int, RGB]:
    """One palette colour per worker pid, in pid order (the palette repeats past 8)."""
    return {pid: PALETTE[i % len(PALETTE)] for i, pid in enumerate(sorted(set(pids)))}


def tint(value: int, colour: RGB) -> RGB:
    """A pixel of Mandelbrot shading in a worker's colour: inside the set (0) a dark
    shade of it (so tiles inside the set show their worker too), far outside it (FAR)
    the colour itself, towards the set's edge (255) white."""
    if value <= FAR:
        return _mix(_mix(BLACK, colour, INSIDE), colour, value / FAR)
    return _mix(colour, WHITE, (value - FAR) / (255 - FAR))


def _mix(a: RGB, b: RGB, t: float) -> RGB:
    return (
        round(a[0] + (b[0] - a[0]) * t),
        round(a[1] + (b[1] - a[1]) * t),
        round(a[2] + (b[2] - a[2]) * t),
    )


def compose(
    width: int,
    height: int,
    layout: Sequence[Tile],
    rendered: Iterable[RenderedTile],
    palette: Mapping[int, RGB],
) -> bytes:
    """The RGB pixels of the whole image, each tile in its worker's colour from `palette`
    (one for every worker pid among `rendered`). A tile rendered after a failed attempt
    gets a red frame; a tile with no effect stays dark grey."""
    image = bytearray(bytes(MISSING) * (width * height))
    luts = {pid: [bytes(tint(v, c)) for v in range(256)] for pid, c in palette.items()}
    for effect in rendered:
        tile = layout[effect.tile]
        lut = luts[effect.worker_pid]
        for row in range(tile.h):
            line = effect.pixels[row * tile.w : (row + 1) * tile.w]
            start = ((tile.y + row) * width + tile.x) * 3
            image[start : start + tile.w * 3] = b"".join(lut[v] for v in line)
        if effect.attempt > 1:
            _frame(image, width, tile)
    return bytes(image)


def _frame(image: bytearray, width: int, tile: Tile) -> None:
    """A 2-pixel red border just inside the tile."""
    for y in range(tile.y, tile.y + tile.h):
        for x in range(tile.x, tile.x + tile.w):
            if min(x - tile.x, y - tile.y, tile.x + tile.w - 1 - x, tile.y + tile.h - 1 - y) < 2:
                image[(y * width + x) * 3 : (y * width + x) * 3 + 3] = bytes(FRAME)
