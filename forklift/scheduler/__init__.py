"""Periodic jobs: schedules declared in code, fired once per fire time across replicas.

`App.periodic()` declares a schedule (`declare.py`); every supervisor runs a `Scheduler`
(`service.py`) that turns each fire time into one job, keyed by the schedule's name and
the fire time, so replicas racing for it insert one job and no leader is needed.
"""

from __future__ import annotations

from forklift.scheduler.schedule import Schedule

__all__ = ["Schedule"]
