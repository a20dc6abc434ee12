"""The caption strip under the demo's image: lines of text, some led by a colour swatch,
drawn in the built-in bitmap font and wrapped to the image's width."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from forklift.demo import font
from forklift.demo.image import FRAME, RGB

BACKGROUND: RGB = (24, 24, 28)
TEXT: RGB = (230, 230, 230)
GOOD: RGB = (102, 187, 106)
BAD: RGB = FRAME
MARGIN = 4  # around the strip's text, in font pixels (times the scale)
LEADING = 4  # between rows
GAP = 3  # characters between two items on one row
MAX_SCALE = 6


@dataclass(frozen=True)
class Item:
    """Text on a caption line, led by a square of `swatch` (framed in red when `framed`,
    as a tile rendered again is in the image)."""

    text: str
    colour: RGB = TEXT
    swatch: RGB | None = None
    framed: bool = False


Line = Sequence[Item]  # side by side while they fit; the rest go on the rows below


@dataclass(frozen=True)
class Placed:
    """Where one row's worth of an item goes: its swatch (on its first row only) and text."""

    x: int  # the swatch's left (or the text's, without one), in pixels
    row: int
    text: str
    item: Item
    first: bool


class Canvas:
    """An RGB image in memory that rectangles and text are drawn on, clipped at its edges."""

    def __init__(self, width: int, height: int, background: RGB) -> None:
        self.width = width
        self.height = height
        self.pixels = bytearray(bytes(background) * (width * height))

    def rect(self, x: int, y: int, w: int, h: int, colour: RGB) -> None:
        left, right = max(0, x), min(self.width, x + w)
        if left >= right:
            return
        line = bytes(colour) * (right - left)
        for row in range(max(0, y), min(self.height, y + h)):
            start = (row * self.width + left) * 3
            self.pixels[start : start + len(line)] = line

    def text(self, x: int, y: int, text: str, colour: RGB, scale: int = 1) -> None:
        """`text` with its top left at (x, y), each font pixel `scale` x `scale`."""
        for i, char in enumerate(text):
            left = x + i * font.ADVANCE * scale
            for gx, gy in font.lit(char):
                self.rect(left + gx * scale, y + gy * scale, scale, scale, colour)


def scale_for(width: int) -> int:
    """Font pixels per image pixel: 1 up to 639 pixels wide, one more per 320 after."""
    return max(1, min(MAX_SCALE, width // 320))


def wrap(text: str, chars: int) -> list[str]:
    """`text` in rows of at most `chars` characters, broken at spaces (a word longer than
    a row is cut)."""
    chars = max(1, chars)
    rows: list[str] = []
    row = ""
    for word in text.split(" "):
        while len(word) > chars:
            if row:
                rows.append(row)
                row = ""
            rows.append(word[:chars])
            word = word[chars:]
        if not row:
            row = word
        elif len(row) + 1 + len(word) <= chars:
            row += " " + word
        else:
            rows.append(row)
            row = word
    return [*rows, row] if row or not rows else rows


def place(lines: Sequence[Line], width: int, scale: int) -> tuple[list[Placed], int]:
    """Every item's rows laid out left to right, a new row where the next does not fit;
    and how many rows that takes."""
    advance, margin = font.ADVANCE * scale, MARGIN * scale
    right = width - margin
    placed: list[Placed] = []
    row = 0
    for line in lines:
        x = margin
        for item in line:
            lead = _lead(item, scale)
            if x > margin and x + lead + font.text_width(item.text, scale) > right:
                row, x = row + 1, margin
            pieces = wrap(item.text, (right - x - lead + scale) // advance)
            for i, piece in enumerate(pieces):
                placed.append(Placed(x, row + i, piece, item, first=i == 0))
            row += len(pieces) - 1
            x += lead + len(pieces[-1]) * advance + GAP * advance
        row += 1
    return placed, row


def _lead(item: Item, scale: int) -> int:
    """The swatch's width and the space after it (none without a swatch)."""
    return (font.HEIGHT + font.ADVANCE) * scale if item.swatch is not None else 0


def strip(width: int, lines: Sequence[Line]) -> tuple[int, bytes]:
    """The caption strip for an image `width` pixels wide: its height and RGB pixels."""
    scale = scale_for(width)
    placed, rows = place(lines, width, scale)
    pitch = (font.HEIGHT + LEADING) * scale
    canvas = Canvas(width, 2 * MARGIN * scale + rows * pitch - LEADING * scale, BACKGROUND)
    for p in placed:
        y = MARGIN * scale + p.row * pitch
        if p.item.swatch is not None and p.first:
            _swatch(canvas, p.x, y, p.item.swatch, p.item.framed, scale)
        canvas.text(p.x + _lead(p.item, scale), y, p.text, p.item.colour, scale)
    return canvas.height, bytes(canvas.pixels)


def _swatch(canvas: Canvas, x: int, y: int, colour: RGB, framed: bool, scale: int) -> None:
    """A square as tall as a letter; a red frame round it like the image's."""
    side = font.HEIGHT * scale
    canvas.rect(x, y, side, side, FRAME if framed else colour)
    if framed:
        canvas.rect(x + scale, y + scale, side - 2 * scale, side - 2 * scale, colour)
