"""VanishedOwners on a scripted store: when an owner without its liveness lock is charged."""

from __future__ import annotations

from typing import Any

import pytest

from forklift.errors import DatabaseError
from forklift.metrics import Totals
from forklift.supervisor.deaths import VanishedConfig, VanishedOwners
from forklift.supervisor.store import ChargedJob
from tests.unit.supervisor.conftest import FakeStore


class Store(FakeStore):
    """Answers owners_unlocked() from a script; records the charges."""

    def __init__(self) -> None:
        super().__init__()
        self.unlocked: list[str] = []
        self.charges: list[tuple[str, dict[str, Any]]] = []

    def owners_unlocked(self) -> list[str]:
        if self.down:
            raise DatabaseError("looking for vanished workers failed: it is away")
        return list(self.unlocked)

    def job_fail_orphaned(self, owner: str, error: str, **kw: Any) -> list[ChargedJob]:
        self.charges.append((owner, kw))
        return [ChargedJob(1, "ready", 1, "default", "render")]


@pytest.fixture
def store() -> Store:
    return Store()


@pytest.fixture
def vanished(store: Store) -> VanishedOwners:
    return VanishedOwners(store, Totals(), VanishedConfig(every=0.5, confirm=1.0))


def test_an_owner_unlocked_for_the_confirmation_time_is_charged_once(
    store: Store, vanished: VanishedOwners
) -> None:
    store.unlocked = ["h:1:a"]
    assert vanished.run_once(now=10.0).charged == 0  # first sighting
    assert vanished.run_once(now=10.5).charged == 0
    assert vanished.run_once(now=11.0).charged == 1
    ((owner, kw),) = store.charges
    assert owner == "h:1:a" and kw["unlocked"] is True and kw["retry"] is None
    assert kw["forgive"] is True  # which handlers ran is not known: the unseen are forgiven
    assert vanished.totals.jobs == {("default", "render", "crashed"): 1}


def test_an_owner_that_took_its_lock_back_starts_over(
    store: Store, vanished: VanishedOwners
) -> None:
    store.unlocked = ["h:1:a"]
    vanished.run_once(now=10.0)
    store.unlocked = []  # it reconnected: the lock is held again
    vanished.run_once(now=10.5)
    store.unlocked = ["h:1:a"]
    assert vanished.run_once(now=11.0).charged == 0
    assert vanished.run_once(now=11.5).charged == 0
    assert vanished.run_once(now=12.0).charged == 1


def test_a_failed_round_forgets_what_was_seen(store: Store, vanished: VanishedOwners) -> None:
    # After an outage every lock is free for a moment: only fresh sightings count.
    store.unlocked = ["h:1:a"]
    vanished.run_once(now=10.0)
    store.down = True
    with pytest.raises(DatabaseError):
        vanished.run_once(now=10.5)
    store.down = False
    assert vanished.run_once(now=11.0).charged == 0
    assert vanished.run_once(now=11.5).charged == 0
    assert vanished.run_once(now=12.0).charged == 1
