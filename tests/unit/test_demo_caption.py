"""The demo image's caption: the bitmap font, text drawn with it, the strip's layout and
what the callback writes in it."""

from __future__ import annotations

import string
from collections.abc import Sequence

import pytest

from forklift.batch import BatchStatus
from forklift.demo import font
from forklift.demo.assembly import Facts, Retried, caption, owner_pid
from forklift.demo.caption import (
    BACKGROUND,
    BAD,
    GOOD,
    MARGIN,
    TEXT,
    Canvas,
    Item,
    Line,
    place,
    scale_for,
    strip,
    wrap,
)
from forklift.demo.image import FRAME, PALETTE, RGB

INK: RGB = (255, 255, 255)
PAPER: RGB = (0, 0, 0)


def test_every_glyph_is_five_by_seven_and_the_caption_needs_no_other() -> None:
    for char, rows in font.GLYPHS.items():
        assert len(char) == 1 and len(rows) == font.HEIGHT, char
        assert all(len(r) == font.WIDTH and set(r) <= {".", "#"} for r in rows), char
    needed = string.ascii_letters + string.digits + " .,:;()-+/=!?'%#"
    assert set(needed) <= set(font.GLYPHS)
    assert all(any("#" in r for r in font.GLYPHS[c]) for c in needed if c != " ")
    assert font.glyph("é") == font.MISSING  # an empty box, not nothing


def test_lit_pixels_are_the_glyphs_marks() -> None:
    assert font.lit(" ") == []
    assert font.lit("1")[:3] == [(2, 0), (1, 1), (2, 1)]  # the top of the 1, then its flag
    assert len(font.lit("-")) == font.WIDTH
    assert font.text_width("") == 0
    assert font.text_width("ab") == 2 * font.ADVANCE - 1
    assert font.text_width("ab", 3) == 3 * (2 * font.ADVANCE - 1)


def pixel(canvas: Canvas, x: int, y: int) -> RGB:
    at = (y * canvas.width + x) * 3
    r, g, b = canvas.pixels[at : at + 3]
    return (r, g, b)


def test_text_is_drawn_glyph_by_glyph_each_font_pixel_scale_by_scale() -> None:
    canvas = Canvas(20, 16, PAPER)
    canvas.text(1, 1, "-", INK, scale=2)  # the bar of "-": font row 3, columns 0..4
    inked = {(x, y) for y in range(16) for x in range(20) if pixel(canvas, x, y) == INK}
    assert inked == {(1 + x, 1 + 3 * 2 + dy) for x in range(font.WIDTH * 2) for dy in (0, 1)}
    canvas = Canvas(20, 9, PAPER)
    canvas.text(1, 1, "i!", INK)  # the second letter starts one ADVANCE along
    assert pixel(canvas, 1 + 2, 1) == INK and pixel(canvas, 1 + font.ADVANCE + 2, 1) == INK
    assert pixel(canvas, 1 + font.WIDTH, 1 + 2) == PAPER  # the gap between them


def test_drawing_is_clipped_at_the_canvas_edges() -> None:
    canvas = Canvas(8, 8, PAPER)
    canvas.text(-4, -3, "WWW", INK, scale=2)
    canvas.rect(6, 6, 50, 50, INK)
    assert len(canvas.pixels) == 8 * 8 * 3
    assert pixel(canvas, 7, 7) == INK


@pytest.mark.parametrize(
    ("text", "chars", "rows"),
    [
        ("worker 4242: 150 tiles", 40, ["worker 4242: 150 tiles"]),
        ("worker 4242: 150 tiles", 12, ["worker 4242:", "150 tiles"]),
        ("a verylongword b", 5, ["a", "veryl", "ongwo", "rd b"]),
        ("", 5, [""]),
    ],
)
def test_wrap_breaks_at_spaces_and_cuts_only_what_cannot_fit(
    text: str, chars: int, rows: list[str]
) -> None:
    assert wrap(text, chars) == rows


def test_items_sit_side_by_side_while_they_fit_then_wrap() -> None:
    line = [Item(f"worker {pid}: 10 tiles", swatch=PALETTE[0]) for pid in (1, 2, 3)]
    wide, rows = place([line], 1000, 1)
    assert rows == 1 and len({p.x for p in wide}) == 3
    narrow, rows = place([line, [Item("verdict")]], 150, 1)
    assert rows == 4 and [p.row for p in narrow] == [0, 1, 2, 3]
    assert {p.x for p in narrow} == {MARGIN}
    assert scale_for(160) == 1 and scale_for(640) == 2 and scale_for(4096) == 6


def test_the_strip_holds_each_swatch_whole_and_the_text_in_its_colour() -> None:
    blue, orange = PALETTE[0], PALETTE[1]
    lines = [
        [Item("worker 1: 2 tiles", swatch=blue), Item("worker 2: 1 tile", swatch=orange)],
        [Item("worker 1 killed at tile 0, rendered again", swatch=orange, framed=True)],
        [Item("3 effects for 3 tiles, callback ran once", GOOD)],
    ]
    height, rgb = strip(320, lines)
    assert len(rgb) == 320 * height * 3
    canvas = Canvas(320, height, BACKGROUND)
    canvas.pixels[:] = rgb
    colours = [pixel(canvas, x, y) for y in range(height) for x in range(320)]
    side = font.HEIGHT  # scale 1 at 320 pixels wide
    assert colours.count(blue) == side * side
    assert colours.count(orange) == side * side + (side - 2) ** 2  # plain, and framed
    assert colours.count(FRAME) == side * side - (side - 2) ** 2
    assert TEXT in colours and GOOD in colours
    assert pixel(canvas, 0, 0) == BACKGROUND and pixel(canvas, 319, height - 1) == BACKGROUND


def facts(*, retried: list[Retried] | None = None, rows: int = 3, earlier: int = 0) -> Facts:
    status = BatchStatus(1, 3, 0, 0, 3, 0, 0, True, True, "succeeded", 4)
    return Facts(status, [], {10: 2, 11: 1}, retried or [], rows, 3, earlier)


def texts(lines: Sequence[Line]) -> list[list[str]]:
    return [[item.text for item in line] for line in lines]


def test_the_caption_says_which_tint_is_which_worker_the_kill_and_the_verdict() -> None:
    palette = {10: PALETTE[0], 11: PALETTE[1]}
    killed = Retried(1, 10, "WorkerDied: worker process killed by SIGKILL: possibly", 11)
    lines = caption(facts(retried=[killed]), palette, 3, attempt=1)
    assert texts(lines) == [
        ["3 tiles, tinted by the worker that rendered each:"],
        ["worker 10: 2 tiles", "worker 11: 1 tile"],
        ["worker 10 killed at tile 1, rendered again"],
        ["3 effects for 3 tiles, callback ran once"],
    ]
    assert [i.swatch for i in lines[1]] == [PALETTE[0], PALETTE[1]]
    assert lines[2][0].framed and lines[2][0].swatch == PALETTE[1]  # who rendered it again
    assert lines[3][0].colour == GOOD


def test_the_caption_verdict_turns_red_on_a_doubled_effect_or_a_second_run() -> None:
    doubled = caption(facts(rows=4), {10: PALETTE[0], 11: PALETTE[1]}, 3, attempt=1)
    assert doubled[-1][0].text == "4 effects for 3 tiles (3 distinct), callback ran once"
    assert doubled[-1][0].colour == BAD
    again = caption(facts(earlier=1), {10: PALETTE[0], 11: PALETTE[1]}, 3, attempt=2)
    assert again[-1][0].text.endswith("callback ran 2 times") and again[-1][0].colour == BAD
    retried = caption(facts(), {10: PALETTE[0], 11: PALETTE[1]}, 3, attempt=2)
    assert retried[-1][0].text.endswith("callback ran once, on attempt 2")


def test_a_failed_attempt_is_told_by_its_kind() -> None:
    lease = Retried(5, 42, "LeaseExpired: lease of h:42:ab expired", None)
    assert lease.text() == "worker 42 failed (LeaseExpired) at tile 5, never rendered"
    assert owner_pid("host:4242:ab12") == 4242 and owner_pid("") is None
