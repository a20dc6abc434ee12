"""The prefork supervisor: one parent, N worker children."""

from __future__ import annotations

from forklift.supervisor.arbiter import Supervisor
from forklift.supervisor.config import SupervisorConfig

__all__ = ["Supervisor", "SupervisorConfig"]
