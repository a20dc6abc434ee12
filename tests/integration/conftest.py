"""Integration fixtures: the test app bound to this test's schema, workers in threads."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest

import forklift
from forklift import _db, _locks
from forklift.metrics import Tally
from forklift.store import JobStore
from forklift.testing import wait_for
from forklift.workers import Worker, WorkerConfig
from tests.apps import basic


@pytest.fixture
def app(dsn: str, schema: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[forklift.App]:
    """tests.apps.basic's app, pointed at this test's schema."""
    monkeypatch.setattr(basic.app, "_dsn", dsn)
    monkeypatch.setattr(basic.app, "schema", schema)
    monkeypatch.setattr(basic, "SCHEMA", schema)
    basic.app.close()
    yield basic.app
    basic.app.close()


@contextmanager
def horizon_held(dsn: str) -> Iterator[None]:
    """Another session holds a transaction id, idle in transaction: no dead version
    younger than it can be vacuumed away, nor skipped by an index scan as dead."""
    with psycopg.connect(dsn) as holder:
        holder.execute("SELECT txid_current()")
        yield
        holder.rollback()


def let_go(session: psycopg.Connection[Any], db: psycopg.Connection[Any], *locks: str) -> None:
    """Close a session that holds advisory locks, and wait until the server has let them
    go: its backend ends, and the locks with it, a moment after the socket closes."""
    session.close()
    wait_for(lambda: _locks.held_by_anyone(db, list(locks)) == set(), what="the locks let go")


RunWorker = Callable[..., Worker]


@pytest.fixture
def task(app: forklift.App) -> Iterator[Callable[..., str]]:
    """Register a throwaway task on the test app, named as its function, retrying at
    once (removed afterwards); its name."""
    names: list[str] = []

    def register(fn: Callable[..., Any], **options: Any) -> str:
        options.setdefault("backoff", forklift.Backoff(base=0.01, factor=1.0, jitter=0.0))
        app.task(name=fn.__name__, **options)(fn)
        names.append(fn.__name__)
        return fn.__name__

    yield register
    for name in names:
        del app.tasks[name]


@pytest.fixture
def run_worker(app: forklift.App) -> Iterator[RunWorker]:
    """Start Worker(app, WorkerConfig(**kwargs)).run() in a thread, booted on return;
    stopped at teardown."""
    started: list[tuple[Worker, threading.Thread]] = []

    def start(**kwargs: Any) -> Worker:
        kwargs.setdefault("maintenance", False)
        worker = Worker(app, WorkerConfig(**kwargs))
        worker.booted.enable()
        worker.idle.enable()
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        worker.booted.wait()  # its services exist from here on
        return worker

    yield start
    for worker, _ in started:
        worker.request_stop(fast=True)
    for _, thread in started:
        thread.join(timeout=15)
        assert not thread.is_alive(), "worker did not stop"


def tallied(app: forklift.App, until: Callable[[], object]) -> dict[str, Any]:
    """Run Worker(app) with a metrics Tally in a thread until `until()` returns, then
    stop it: what it counted (Tally.take), every count in since it stopped."""
    tally = Tally()
    worker = Worker(app, WorkerConfig(maintenance=False), tally=tally)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        until()
    finally:
        worker.request_stop(fast=True)
        thread.join(15)
    assert not thread.is_alive(), "worker did not stop"
    deltas = tally.take()
    assert deltas is not None, "nothing counted"
    return deltas


@pytest.fixture
def store(dsn: str, schema: str) -> Iterator[JobStore]:
    """A JobStore on a pool of its own, for this test's schema."""
    pool = _db.make_pool(dsn, _db.Timeouts(), max_size=2, name="test-store")
    pool.open(wait=True, timeout=10)
    yield JobStore(pool, schema)
    pool.close()
