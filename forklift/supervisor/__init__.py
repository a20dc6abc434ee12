"""The prefork supervisor: one parent, N worker children."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forklift.supervisor.arbiter import Supervisor
    from forklift.supervisor.config import SupervisorConfig

# Imported on first use: `forklift.supervisor.config` (the CLI's defaults) must not pull
# in the whole supervisor.
_LAZY = {
    "Supervisor": "forklift.supervisor.arbiter",
    "SupervisorConfig": "forklift.supervisor.config",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'forklift.supervisor' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = ["Supervisor", "SupervisorConfig"]
