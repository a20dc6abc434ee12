"""What the tasks of every peer do: nothing, stamp their start, burn CPU, or nap.

The CPU work is `spin` of bench/cpu_app.py itself, read from that file's source: that
module imports forklift, which the peers venv does not have, and a copy could drift.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import _stamps

CPU_APP = Path(__file__).resolve().parent.parent / "cpu_app.py"


def _load_spin() -> Callable[[int], int]:
    """bench.cpu_app.spin, compiled from its definition alone (no forklift import)."""
    tree = ast.parse(CPU_APP.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "spin")
    namespace: dict[str, Any] = {}
    exec(compile(ast.Module([node], type_ignores=[]), str(CPU_APP), "exec"), namespace)
    spin: Callable[[int], int] = namespace["spin"]
    return spin


spin = _load_spin()


def started(key: str, enqueued_at: float = 0.0) -> None:
    """Record the start of job `key` (see bench._stamps): the first act of a stamp or nap task."""
    _stamps.stamp(key, enqueued_at)
