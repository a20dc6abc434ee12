"""A process's resident set size, read from /proc (the parent polices it, the child reports it)."""

from __future__ import annotations

import os

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_of(pid: int | str = "self") -> int:
    """Resident set size in bytes, from /proc (0 if the process is gone)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0
