"""Deploy fixtures: what a supervisor's /metrics exports, read from its own registry;
and the acceptance tier's `forklift_cli` (the real CLI under Popen)."""

from __future__ import annotations

import pytest

from tests.acceptance.conftest import forklift_cli
from tests.deploy.support import exported_metrics

__all__ = ["exported", "forklift_cli"]


@pytest.fixture
def exported(dsn: str, schema: str) -> set[str]:
    """Every series name forklift exports (a supervisor's registry, on a fresh schema)."""
    return exported_metrics(dsn, schema)
