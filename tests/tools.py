"""Command-line tools some tests drive (tmux, promtool, hadolint, systemd-analyze ...).

Where one is not installed a test skips, saying which and how to get it; but CI sets
FORKLIFT_TEST_REQUIRE_TOOLS=1 (and scripts/setup installs them), so there a missing tool
fails the test instead of quietly not checking anything.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest


def tool(name: str, *, install: str) -> str:
    """The path of a command-line tool, from the venv first; skip (or, in CI, fail) if
    it is not installed."""
    found = shutil.which(
        name,
        path=os.pathsep.join(
            [
                str(Path(sys.executable).parent),
                *(os.environ.get("PATH", "").split(os.pathsep)),
                "/usr/sbin",  # Debian puts daemons there (pgbouncer), off a user's PATH
            ]
        ),
    )
    if found is None:
        message = f"{name} is not installed ({install})"
        if os.environ.get("FORKLIFT_TEST_REQUIRE_TOOLS") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return found
