"""Deploy fixtures: what a supervisor's /metrics exports, read from its own registry."""

from __future__ import annotations

import pytest

from tests.deploy.support import exported_metrics


@pytest.fixture
def exported(dsn: str, schema: str) -> set[str]:
    """Every series name forklift exports (a supervisor's registry, on a fresh schema)."""
    return exported_metrics(dsn, schema)
