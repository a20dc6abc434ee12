"""The deadline keeper on a real socket pair: a bound rearmed in time never fires; one left
alone fires once past its deadline, shutting its socket down (the other end reads EOF)."""

from __future__ import annotations

import socket
import time

from forklift import _deadlines
from forklift.testing import wait_for


def test_a_rearmed_bound_never_fires_and_one_left_alone_shuts_its_socket() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        keeper = _deadlines.Keeper()
        bound = _deadlines.Bound(keeper, ours.fileno(), 0.5)
        bound.rearm()
        until = time.monotonic() + 1.5  # three of its deadlines, each restarted in time
        while time.monotonic() < until:
            time.sleep(0.02)
            bound.rearm()
        assert not bound.fired
        ours.sendall(b"still open")
        assert theirs.recv(16) == b"still open"
        wait_for(lambda: bound.fired, timeout=5, what="the deadline kept")
        theirs.settimeout(5)
        assert theirs.recv(16) == b""  # shut down: the other end sees its end
        assert ours.fileno() >= 0  # not closed: the descriptor is still the connection's


def test_a_disarmed_bound_is_left_alone() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        keeper = _deadlines.Keeper()
        bound = _deadlines.Bound(keeper, ours.fileno(), 0.05)
        bound.rearm()
        keeper.disarm(bound)
        other = _deadlines.Bound(keeper, ours.fileno(), 0.05)  # keeps the thread looking
        other.rearm()
        wait_for(lambda: other.fired, timeout=5, what="the other deadline kept")
        assert not bound.fired
