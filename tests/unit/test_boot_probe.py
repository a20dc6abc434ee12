"""bench/_boot_probe.py wraps forklift's internals by name to time `forklift run`'s boot:
each name must still be there (one went with the interior's renames and bench.cpu
stopped at its start-up, unnoticed until it was run)."""

from __future__ import annotations

import pytest

from bench import _boot_probe


@pytest.mark.parametrize("target", [t for t, _, _ in _boot_probe.WRAPPED] + [_boot_probe.CLAIM])
def test_every_function_the_boot_probe_wraps_is_still_there(target: str) -> None:
    owner, name = _boot_probe.found(target)
    assert callable(getattr(owner, name))


def test_a_name_that_is_gone_is_named() -> None:
    with pytest.raises(KeyError, match=r"Supervisor\.gone is gone"):
        _boot_probe.found("forklift.supervisor.arbiter:Supervisor.gone")
