"""`forklift top`'s loop: the first frame, then one a second on the terminal until q."""

from __future__ import annotations

import argparse
import sys
import time

from rich.console import Console
from rich.live import Live

from forklift.cli.apps import app_for
from forklift.cli.top.frame import Frame, TopReader, Trends, frame_json
from forklift.cli.top.terminal import Keys
from forklift.cli.top.view import render
from forklift.errors import DatabaseError
from forklift.shown import output

REFRESH = 1.0  # seconds between frames
ONCE_HEIGHT = 200  # lines `--once` may print: all there is, not a screen's worth


def _first(reader: TopReader) -> Frame:
    """The first frame; a database that does not answer is one error line, not a screen."""
    frame = reader.read()
    if frame.error is not None:
        raise DatabaseError(frame.error)
    return frame


def top(args: argparse.Namespace) -> int:
    app = app_for(args)
    reader = TopReader(app.dsn, app.schema)
    frame = _first(reader)
    if args.json:
        output.print_json(frame_json(frame))
        return 0
    console = Console()
    if args.once:
        trends = Trends()
        trends.add(frame)
        console.print(render(frame, trends, console.width, ONCE_HEIGHT))
        return 0
    return watch(reader, frame, console, Keys(sys.stdin))


def watch(reader: TopReader, frame: Frame, console: Console, keys: Keys) -> int:
    """Refresh every second until q; the terminal is restored however it ends."""
    trends = Trends()
    with keys, Live(console=console, screen=True, auto_refresh=False) as live:
        while True:
            trends.add(frame)
            live.update(render(frame, trends, console.width, console.height), refresh=True)
            deadline = time.monotonic() + REFRESH
            while (left := deadline - time.monotonic()) > 0:
                if "q" in keys.wait(left).lower():
                    return 0
            frame = reader.read()
