"""The demo's parts that need no database: tiles, the PNG writer, colours, its story."""

from __future__ import annotations

import argparse
import os
import signal
import struct
import zlib

import pytest

from forklift.cli.demo import size
from forklift.demo.database import Charged, Snapshot
from forklift.demo.fractal import TILE, Tile, render, tiles
from forklift.demo.image import FAR, FRAME, MISSING, PALETTE, RenderedTile, colours, compose, tint
from forklift.demo.interrupts import Interrupted, Interrupts
from forklift.demo.png import SIGNATURE, encode_png
from forklift.demo.story import Story


def chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    """(type, data) of every chunk, each CRC checked."""
    assert png[:8] == SIGNATURE
    found, at = [], 8
    while at < len(png):
        (length,) = struct.unpack(">I", png[at : at + 4])
        kind, data = png[at + 4 : at + 8], png[at + 8 : at + 8 + length]
        (crc,) = struct.unpack(">I", png[at + 8 + length : at + 12 + length])
        assert crc == zlib.crc32(kind + data)
        found.append((kind, data))
        at += 12 + length
    return found


def test_png_holds_the_pixels_row_by_row() -> None:
    rgb = bytes(range(3 * 2 * 3))  # 3x2 pixels
    kinds = chunks(encode_png(3, 2, rgb))
    assert [k for k, _ in kinds] == [b"IHDR", b"IDAT", b"IEND"]
    assert struct.unpack(">IIBBBBB", kinds[0][1]) == (3, 2, 8, 2, 0, 0, 0)
    assert zlib.decompress(kinds[1][1]) == b"\x00" + rgb[:9] + b"\x00" + rgb[9:]


@pytest.mark.parametrize(("width", "height", "length"), [(3, 2, 17), (0, 2, 0), (2, 2, 13)])
def test_png_refuses_pixels_that_do_not_fit(width: int, height: int, length: int) -> None:
    with pytest.raises(ValueError, match="RGB image"):
        encode_png(width, height, bytes(length))


def test_tint_runs_from_a_dark_shade_through_the_colour_to_white() -> None:
    colour = (200, 100, 50)
    inside = tint(0, colour)
    assert inside != (0, 0, 0) and all(c < o / 3 for c, o in zip(inside, colour, strict=True))
    assert tint(FAR, colour) == colour
    assert tint(255, colour) == (255, 255, 255)
    brightness = [sum(tint(v, colour)) for v in range(256)]
    assert brightness == sorted(brightness)


def test_each_worker_gets_its_own_colour_in_pid_order() -> None:
    assert colours([30, 10, 20, 10]) == {10: PALETTE[0], 20: PALETTE[1], 30: PALETTE[2]}
    many = colours(range(len(PALETTE) + 1))
    assert len(set(many.values())) == len(PALETTE)
    assert FRAME not in PALETTE


def test_tiles_cover_the_image_once_and_clip_at_the_edges() -> None:
    layout = tiles(70, 40)
    assert [t.index for t in layout] == list(range(6))
    assert layout[2] == Tile(2, 64, 0, 6, TILE) and layout[5] == Tile(5, 64, 32, 6, 8)
    assert sum(t.w * t.h for t in layout) == 70 * 40


def test_render_shades_inside_black_and_far_outside_from_far() -> None:
    corner = render(Tile(0, 0, 0, 8, 4), 640, 480)  # the view's top left: far outside
    assert len(corner) == 32
    assert all(FAR <= v < 128 for v in corner)
    assert render(Tile(0, 420, 240, 1, 1), 640, 480) == b"\x00"  # -0.2 + 0i: inside


def test_compose_tints_by_worker_and_frames_the_tile_rendered_again() -> None:
    layout = tiles(64, 32)  # two tiles side by side
    far = bytes([FAR]) * (TILE * TILE)
    palette = {7: PALETTE[0], 8: PALETTE[1]}
    rgb = compose(64, 32, layout, [RenderedTile(1, 8, 2, far)], palette)

    def pixel(x: int, y: int) -> tuple[int, ...]:
        return tuple(rgb[(y * 64 + x) * 3 : (y * 64 + x) * 3 + 3])

    assert pixel(5, 5) == MISSING  # tile 0 has no effect
    assert pixel(32, 0) == FRAME and pixel(33, 1) == FRAME  # tile 1 was attempt 2
    assert pixel(40, 10) == PALETTE[1]


def test_story_tells_each_event_once_with_the_workers_pid() -> None:
    story = Story(workers=1)
    started = {"event": "child.started", "pid": 1, "index": 0, "owner": "h:4242:ab"}
    assert story.news(empty(), [started]) == ["supervisor started worker 4242"]
    died = {
        "event": "child.exited",
        "pid": 1,  # the supervisor's own pid: the log line's, not the worker's
        "index": 0,
        "reason": "WorkerDied: worker process killed by SIGKILL: possibly out of memory",
    }
    charged = empty(charged=[Charged(3, 1, "ready", "WorkerDied: x")])
    assert story.news(charged, [died, {**started, "owner": "h:4343:cd"}]) == [
        "supervisor reaped worker 4242: worker process killed by SIGKILL",
        "supervisor started worker 4343 in its place",
        "tile 3 charged: WorkerDied: x",
    ]
    assert story.news(charged, []) == []


def empty(charged: list[Charged] | None = None) -> Snapshot:
    return Snapshot(states={}, by_worker={}, running=[], charged=charged or [], rerendered={})


def test_size_reads_width_x_height() -> None:
    assert size("640x480") == (640, 480)
    for bad in ("640", "x480", "8x8", "640x480x2", "wide"):
        with pytest.raises(argparse.ArgumentTypeError):
            size(bad)


def test_a_signal_in_a_shielded_section_is_raised_after_it() -> None:
    finished = False
    before = signal.getsignal(signal.SIGTERM)
    with Interrupts() as interrupts, pytest.raises(Interrupted) as raised, interrupts.shielded():
        os.kill(os.getpid(), signal.SIGTERM)
        finished = True
    assert finished
    assert raised.value.signum == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before  # restored on exit
