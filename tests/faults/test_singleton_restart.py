"""app.singleton() across a database restart: the holder is told it lost the lock."""

from __future__ import annotations

import time
from typing import Literal

import pytest

import forklift
from forklift.embedded import Cluster
from forklift.testing import wait_for


@pytest.mark.parametrize("mode", ["fast", "immediate"])
def test_a_restart_turns_the_holder_false_within_a_second(
    cluster: Cluster, mode: Literal["fast", "immediate"]
) -> None:
    app = forklift.App(cluster.dsn, schema="singleton_restart")
    with app.singleton("nightly") as held:
        assert held
        cluster.stop(mode)  # ends every session: the lock is free once the server is back
        stopped = time.monotonic()
        try:
            wait_for(lambda: not held, timeout=5, what="the holder told it lost the lock")
            noticed = time.monotonic() - stopped
            assert noticed < 1.0, f"{noticed:.2f}s after the server stopped"
            assert held.lost and held.lost_reason is not None
            with pytest.raises(forklift.SingletonLost):
                held.check()
        finally:
            cluster.start()
        with app.singleton("nightly") as second:  # another holder may enter now
            assert second
    app.close()
