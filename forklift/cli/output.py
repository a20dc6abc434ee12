"""What one-shot commands print: aligned tables for people, JSON for scripts."""

from __future__ import annotations

from collections.abc import Sequence


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
