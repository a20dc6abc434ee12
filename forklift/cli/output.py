"""What one-shot commands print: aligned tables for people, JSON for scripts."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any


def age(seconds: float) -> str:
    """A duration as people read it: 42s, 17m, 3.5h."""
    if seconds < 120:
        return f"{seconds:.0f}s"
    if seconds < 7200:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def table(header: Sequence[str], rows: Sequence[Sequence[object]], *, empty: str) -> None:
    """Columns padded to their widest cell; `empty` when there are no rows."""
    if not rows:
        print(empty)
        return
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
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


def clip(text: str | None, width: int) -> str:
    """The first line of `text`, at most `width` characters (`-` for none)."""
    if not text or not text.strip():
        return "-"
    line = text.strip().splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False))


def hint(text: str) -> None:
    """A note for people on stderr (stdout keeps what scripts and grep read)."""
    print(f"forklift: {text}", file=sys.stderr)
