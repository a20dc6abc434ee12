"""Attribution: a death recorded on the jobs at once, or retried while the database is away."""

from __future__ import annotations

from forklift.metrics import Totals
from forklift.supervisor.deaths import Attribution, Deferred
from forklift.supervisor.states import JobsAction
from forklift.supervisor.store import ChargedJob
from tests.unit.supervisor.conftest import FakeStore


def test_fail_charges_and_release_gives_back(store: FakeStore) -> None:
    totals = Totals()
    attribution = Attribution(store, totals)
    store.charged = [ChargedJob(1, "ready", 1, "q", "a"), ChargedJob(2, "dead", 5, "q", "b")]
    attribution.record("o:1:x", "WorkerDied: exit 3", JobsAction.FAIL, now=0.0)
    attribution.record("o:2:y", "WorkerDied: shutdown", JobsAction.RELEASE, now=0.0)
    assert store.calls == [
        ("job_fail_orphaned", ("o:1:x", "WorkerDied: exit 3", None)),
        ("job_release_owner", ("o:2:y",)),
    ]
    assert totals.jobs == {
        ("q", "a", "crashed"): 1,
        ("q", "b", "crashed"): 1,
        ("default", "render", "released"): 1,
    }
    assert attribution.deferred == []
    # Either way no handler of theirs runs any more: their cancelled jobs' holds end.
    assert store.let_go == ["o:1:x", "o:2:y"]
    # Which handlers ran was not known: the jobs not seen running are forgiven.
    assert store.forgive_flags == [True]


def test_a_death_with_known_handlers_charges_them_and_forgives_nothing_else(
    store: FakeStore,
) -> None:
    totals = Totals()
    store.charged = [
        ChargedJob(1, "ready", 1, "q", "a"),
        ChargedJob(2, "ready", 1, "q", "b", forgiven=True),
    ]
    Attribution(store, totals).record("o:1:x", "died", JobsAction.FAIL, now=0.0, running=(1,))
    assert store.calls[0] == ("job_fail_orphaned", ("o:1:x", "died", [1]))
    assert store.forgive_flags == [False]
    # A forgiven job (as the database answered) counts as released, not crashed.
    assert totals.jobs == {
        ("q", "a", "crashed"): 1,
        ("q", "b", "released"): 1,
        ("default", "render", "released"): 1,
    }


def test_deferred_attributions_retry_1_s_later_then_doubling_up_to_30_s(store: FakeStore) -> None:
    attribution = Attribution(store, Totals())
    store.down = True
    attribution.record("o:1:x", "died", JobsAction.FAIL, now=100.0)
    attribution.record("o:2:y", "died", JobsAction.RELEASE, now=100.5)
    assert attribution.deferred == [
        Deferred("o:1:x", "died", JobsAction.FAIL),
        Deferred("o:2:y", "died", JobsAction.RELEASE),
    ]
    assert attribution.retry_at == 101.0
    attribution.retry_deferred(100.9)  # not due: not tried
    assert attribution.retry_at == 101.0
    retries = []
    for _ in range(7):
        due = attribution.retry_at
        assert due is not None
        attribution.retry_deferred(due)  # tried, and failed again
        assert attribution.retry_at is not None
        retries.append(attribution.retry_at - due)
    assert retries == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    store.down = False
    attribution.retry_deferred(attribution.retry_at)
    assert attribution.deferred == [] and attribution.retry_at is None
    assert [name for name, _ in store.calls] == ["job_fail_orphaned", "job_release_owner"]
    # The streak is over: the next outage starts again at 1 s.
    store.down = True
    attribution.record("o:3:z", "died", JobsAction.FAIL, now=1000.0)
    assert attribution.retry_at == 1001.0


def test_a_timeout_is_charged_on_the_one_job(store: FakeStore) -> None:
    totals = Totals()
    attribution = Attribution(store, totals)
    attribution.charge_timeout("o:1:x", 7, "job render#7 timed out after 1 s", now=0.0)
    assert store.calls == [
        ("job_fail_orphaned", ("o:1:x", "TimeoutError: job render#7 timed out after 1 s", [7]))
    ]
    assert totals.jobs == {("default", "render", "crashed"): 1}


def test_a_timeout_the_database_missed_is_charged_as_a_timeout_before_the_death(
    store: FakeStore,
) -> None:
    """Before, a timeout whose charge failed was later charged as a crash by the death."""
    attribution = Attribution(store, Totals())
    store.down = True
    attribution.charge_timeout("o:1:x", 7, "job render#7 timed out after 1 s", now=0.0)
    store.down = False  # back before the death is recorded: the death waits its turn
    attribution.record("o:1:x", "WorkerDied: killed", JobsAction.RELEASE, now=0.5)
    assert attribution.deferred == [
        Deferred("o:1:x", "TimeoutError: job render#7 timed out after 1 s", None, (7,)),
        Deferred("o:1:x", "WorkerDied: killed", JobsAction.RELEASE),
    ]
    assert store.calls == []
    attribution.retry_deferred(now=10.0)
    assert store.calls == [
        ("job_fail_orphaned", ("o:1:x", "TimeoutError: job render#7 timed out after 1 s", [7])),
        ("job_release_owner", ("o:1:x",)),
    ]
    assert store.crash_flags == [False]
