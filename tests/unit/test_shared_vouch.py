"""The supervisor's word to its children on its liveness lock: fresh, withdrawn, stale."""

from __future__ import annotations

import os
import time

from forklift.shared_vouch import SharedVouch
from forklift.testing import wait_for


def test_a_confirmation_vouches_until_it_is_withdrawn() -> None:
    vouch = SharedVouch()
    assert not vouch.vouched()  # not taken yet: a child forked at boot waits
    vouch.confirm()
    assert vouch.vouched()
    assert vouch.wait(0.0)
    vouch.withdraw()
    assert not vouch.vouched()


def test_a_confirmation_goes_stale_when_the_session_stops_confirming() -> None:
    vouch = SharedVouch(fresh=0.1)
    vouch.confirm()
    assert vouch.vouched()
    wait_for(lambda: not vouch.vouched(), 2.0, 0.01, "the confirmation gone stale")
    began = time.monotonic()
    assert not vouch.wait(0.2)  # nobody confirms again: the child keeps waiting
    assert time.monotonic() - began >= 0.2


def test_a_waiting_child_sees_the_confirmation_of_another_process() -> None:
    vouch = SharedVouch()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os._exit(0 if vouch.wait(5.0) else 1)
    time.sleep(0.1)
    vouch.confirm()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
