"""A producer's call waits for the database at most its timeout, on the private cluster:
while the database is down, and while the network to it carries nothing. Past it the
call raises DatabaseError (a bulk enqueue has inserted nothing); once the database is
back, the next call works. (Before the timeout a call waited for the pool's 10 s, or,
behind a stalled network, until the network came back.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import forklift
from forklift.embedded import Cluster
from forklift.errors import DatabaseError, ForkliftError
from tests.acceptance.proxy import Proxy
from tests.faults.harness import Workload

# Well under what a call waited without its timeout (10 s at least), well over what one
# of 1 s may take on a loaded machine.
SLACK = 6.0


@pytest.fixture
def producer(workload: Workload, proxy: Proxy) -> Iterator[forklift.App]:
    """A producer that reaches the cluster through the proxy, its pool warm."""
    app = forklift.App(proxy.dsn_through(workload.dsn), schema=workload.schema)
    app.enqueue("warm")
    yield app
    app.close()


def jobs(workload: Workload, table: str = "jobs") -> int:
    """The rows of the workload's `table` (jobs, or batches)."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        row = db.execute(f"SELECT count(*) FROM {workload.schema}.{table}").fetchone()
    assert row is not None
    return int(row[0])


def failed_within(call: Any) -> tuple[DatabaseError, float]:
    began = time.monotonic()
    with pytest.raises(DatabaseError) as raised:
        call()
    return raised.value, time.monotonic() - began


def test_an_enqueue_while_the_database_is_down_fails_within_its_timeout(
    cluster: Cluster, workload: Workload, producer: forklift.App
) -> None:
    cluster.stop("fast")
    try:
        error, took = failed_within(lambda: producer.enqueue("t", timeout=1.0))
        assert took < SLACK, f"held {took:.1f} s"
        assert error.transient, error
        error, took = failed_within(lambda: producer.enqueue_many([("t", {})] * 3, timeout=1))
        assert took < SLACK, f"held {took:.1f} s"
    finally:
        cluster.start()
    assert producer.enqueue("t") > 0  # back: the default timeout waits for a connection
    assert jobs(workload) == 2


@pytest.mark.parametrize("many", [False, True])
def test_an_enqueue_behind_a_stalled_network_fails_within_its_timeout_and_inserts_nothing(
    workload: Workload, proxy: Proxy, producer: forklift.App, many: bool
) -> None:
    def call() -> object:
        if many:
            return producer.enqueue_many([("t", {"n": n}) for n in range(10)], timeout=1)
        return producer.enqueue("t", timeout=1.0)

    proxy.stall()  # the connection stays open; nothing gets through either way
    try:
        error, took = failed_within(call)
    finally:
        proxy.restore()
    assert took < SLACK, f"held {took:.1f} s"
    assert "no answer from the database within 1 s" in str(error), error
    assert "idempotency key" in str(error), error  # what to do when it is not known
    assert error.transient
    assert producer.enqueue("t") > 0  # a fresh connection: the stalled one was dropped
    if many:
        # Its transaction's commit was never sent: none of its ten jobs is added when the
        # network carries the rest of it after all.
        assert jobs(workload) == 2
    else:
        # One statement is its own commit: carried once the network is back, it adds
        # its job (what the error says may happen).
        assert jobs(workload) in (2, 3)


def test_a_batch_behind_a_stalled_network_fails_within_its_timeout_and_adds_nothing(
    workload: Workload, proxy: Proxy, producer: forklift.App
) -> None:
    proxy.stall()
    try:
        error, took = failed_within(
            lambda: producer.enqueue_batch([("t", {"n": n}) for n in range(10)], timeout=1)
        )
    finally:
        proxy.restore()
    assert took < SLACK, f"held {took:.1f} s"
    assert "batch enqueue failed: no answer from the database within 1 s" in str(error), error
    assert "see `forklift batches list`" in str(error), error  # no key to enqueue it with
    assert error.transient
    assert producer.enqueue_batch([("t", {})]).job_ids  # a fresh connection
    # Its transaction's commit was never sent: neither the batch nor its jobs are added.
    assert (jobs(workload, "batches"), jobs(workload)) == (1, 2)


def test_a_batch_block_behind_a_stalled_network_raises_its_own_error_within_its_timeout(
    workload: Workload, proxy: Proxy, producer: forklift.App
) -> None:
    began = time.monotonic()
    try:
        # The block's end (cancel, seal) is bounded too and fails the same way, each in
        # a second: the error raised is the enqueue's, the end's are logged.
        with pytest.raises(DatabaseError) as raised, producer.batch(timeout=1) as batch:
            batch.enqueue("t", n=1)
            proxy.stall()
            batch.enqueue_many([("t", {"n": n}) for n in range(2, 10)])
        took = time.monotonic() - began
    finally:
        proxy.restore()
    assert took < SLACK, f"held {took:.1f} s"
    assert "batch failed: no answer from the database within 1 s" in str(raised.value)
    assert jobs(workload) == 2  # the warm-up and the block's first job, not the 8 after
    assert producer.enqueue("t") > 0  # back


def test_a_first_enqueue_behind_a_stalled_network_fails_within_its_timeout(
    workload: Workload, proxy: Proxy
) -> None:
    # A process's first call opens its producer pool (a probe first, for a clear cause):
    # that opening is bounded by the call's timeout too, with libpq's floor of 2 s for a
    # connection attempt.
    app = forklift.App(proxy.dsn_through(workload.dsn), schema=workload.schema)
    proxy.stall()
    try:
        error, took = failed_within(lambda: app.enqueue("t", timeout=1.0))
    finally:
        proxy.restore()
        app.close()
    assert took < 2 + SLACK / 2, f"held {took:.1f} s"
    assert error.transient, error
    assert jobs(workload) == 0


def test_an_enqueue_timeout_is_a_positive_number_of_seconds(workload: Workload) -> None:
    app = forklift.App(workload.dsn, schema=workload.schema)
    assert app.enqueue_timeout == 5.0  # the documented default
    for bad in (0, -1, float("nan"), float("inf"), True, "5"):
        with pytest.raises(ForkliftError, match="enqueue timeout"):
            app.enqueue("t", timeout=bad)  # type: ignore[arg-type]
        with pytest.raises(ForkliftError, match="enqueue timeout"):
            forklift.App(workload.dsn, enqueue_timeout=bad)  # type: ignore[arg-type]
    assert jobs(workload) == 0
