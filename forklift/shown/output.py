"""How values read for people (ages, times, counts) and what one-shot commands print:
aligned tables for people, JSON for scripts, both safe to show on a terminal
(forklift._display escapes what a terminal would act on)."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from forklift import _display

# The widest a table cell gets: names may be 200 characters, hosts and errors any length,
# and escaping makes them longer still; --json has them whole.
CELL_CHARS = 60


def age(seconds: float) -> str:
    """A duration as people read it: 42s, 17m, 3.5h (never negative: a moment that the
    database stamped just after the one it was read at is 0s ago, not -0s)."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def plural(count: int, noun: str, nouns: str | None = None) -> str:
    """A count and its noun, agreeing: `1 supervisor`, `2 supervisors`, `1 batch`, `3
    batches` (`nouns` for a plural that is not `noun` + s)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def number(value: float) -> str:
    """A count or amount as people read it: 12, 0.25, 3.14, 1234568 (never 1.23e+06)."""
    if isinstance(value, int) or value.is_integer():
        return str(int(value))
    return f"{value:.0f}" if abs(value) >= 100 else f"{value:.3g}"


def percent(value: float | None) -> str:
    """A share in percent, rounded down (99.9% is not 100%), or `-` when not known."""
    return "-" if value is None else f"{math.floor(value)}%"


def fraction(done: float, total: float | None) -> str:
    """How far something is: `12/300 (4%)`, or `12` when its total is not known."""
    if total is None or total <= 0:
        return number(done)
    return f"{number(done)}/{number(total)} ({percent(100.0 * done / total)})"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, empty: str) -> None:
    """Columns padded to their widest cell, each cell escaped and cut to CELL_CHARS;
    `empty` when there are no rows."""
    if not rows:
        print(empty)
        return
    cells = [[str(c) for c in header], *[[cell(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def utc(t: datetime | None) -> str | None:
    """A time as `--json` gives it: ISO 8601 in UTC with a Z (None stays None)."""
    return None if t is None else t.astimezone(UTC).isoformat().replace("+00:00", "Z")


def when(t: datetime | None, now: datetime) -> str:
    """A time as people read it: `2026-12-01 11:22:33Z (3m ago)`, or `-`."""
    if t is None:
        return "-"
    seconds = (now - t).total_seconds()
    relative = f"{age(seconds)} ago" if seconds >= 0 else f"in {age(-seconds)}"
    return f"{t.astimezone(UTC):%Y-%m-%d %H:%M:%S}Z ({relative})"


def cell(value: object, width: int = CELL_CHARS) -> str:
    """One table cell: `value` escaped as one line, at most `width` characters."""
    shown = _display.line(value)
    return shown if len(shown) <= width else shown[: width - 1] + "…"


def clip(text: str | None, width: int) -> str:
    """`text` escaped as one line (newlines too), at most `width` characters (`-` for
    none)."""
    return _display.clip(text, width)


def print_json(value: Any) -> None:
    """`value` as indented JSON, with everything a terminal acts on escaped."""
    print(_display.json_text(value))


def say(text: str) -> None:
    """One line for people on stdout, escaped: it may quote names and errors."""
    print(_display.line(text))


def hint(text: str) -> None:
    """A note for people on stderr (stdout keeps what scripts and grep read)."""
    print(f"forklift: {_display.line(text)}", file=sys.stderr)
