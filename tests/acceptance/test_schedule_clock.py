"""Schedules keep the database's clock: a replica whose host clock is ten minutes off
(under libfaketime) next to a correct one fires every fire time once and on time; and
overlap=False holds for fires the scheduler enqueues ahead of their time."""

from __future__ import annotations

import itertools
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from forklift.testing import wait_for
from tests.acceptance.conftest import Proc, get, metrics_url, scalar
from tests.acceptance.test_observability import samples
from tests.tools import tool

LATE = timedelta(seconds=3)  # a job starts this soon after its fire time (a loaded host)


@dataclass(frozen=True)
class Fired:
    at: datetime  # the fire time (the one in its job's idempotency key)
    jobs: int
    started: datetime | None  # the first job's start, on the database's clock
    states: str


# The fire time, from the key the scheduler gives each fire's job
# (`forklift:schedule:NAME:2026-01-01T00:00:00Z`). Not available_at: a job claimed ahead
# and released (its worker's slot stayed busy too long) is ready again from the release.
FIRE_TIME = r"substring(idempotency_key from '^forklift:schedule:[^:]+:(.+)$')::timestamptz"


def fired(db: psycopg.Connection[Any], schema: str, name: str) -> list[Fired]:
    rows = db.execute(
        f"SELECT {FIRE_TIME} AS at, count(*), min(started_at), string_agg(state::text, ',')"
        f" FROM {schema}.jobs WHERE task = %s GROUP BY at ORDER BY at",
        (name,),
    ).fetchall()
    return [Fired(*r) for r in rows]


def db_now(db: psycopg.Connection[Any]) -> datetime:
    return scalar(db, "SELECT clock_timestamp()")  # type: ignore[no-any-return]


def skewed(env: dict[str, str], seconds: int) -> dict[str, str]:
    """`env` with the host clock `seconds` off: what `faketime -f` sets (libfaketime by
    LD_PRELOAD), monotonic time left true so only the wall clock is wrong."""
    faketime = tool("faketime", install="apt-get install faketime; scripts/setup does")
    shown = subprocess.run(
        [faketime, "-f", f"{seconds:+d}s", "env"], capture_output=True, text=True, check=True
    ).stdout
    found = dict(line.split("=", 1) for line in shown.splitlines() if "=" in line)
    keep = {k: found[k] for k in ("LD_PRELOAD", "FAKETIME")}
    return {**env, **keep, "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def host_offset(env: dict[str, str], db: psycopg.Connection[Any]) -> float:
    """How far a Python child's datetime.now() under `env` is from the database's clock."""
    code = "import datetime; print(datetime.datetime.now(datetime.UTC).timestamp())"
    shown = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    return float(shown.stdout) - db_now(db).timestamp()


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    procs: list[Proc] = []

    def run(env: dict[str, str], *args: str) -> Proc:
        proc = Proc(["run", *args], env, tmp_path / f"forklift-{len(procs)}.log")
        procs.append(proc)
        return proc

    yield run
    for proc in procs:
        proc.kill()


def done_after(db: psycopg.Connection[Any], schema: str, name: str, t: datetime) -> bool:
    return any(f.at > t and f.states == "succeeded" for f in fired(db, schema, name))


@pytest.mark.parametrize("skew", [600, -600])
def test_a_replica_with_a_skewed_clock_fires_each_time_once_and_on_time(
    db: psycopg.Connection[Any],
    schema: str,
    env: dict[str, str],
    start: Callable[..., Proc],
    skew: int,
) -> None:
    off = skewed(env, skew)
    offset = host_offset(off, db)
    assert abs(offset - skew) < 60, f"faketime did not skew the child's clock: {offset:.1f} s"
    run = ("tests.apps.scheduled_clock:app", "--workers", "1")
    began = db_now(db)
    sups = [start(off, *run)]  # alone first: it declares the schedules
    for name in ("every1", "every2"):  # each fired by it alone (a slow boot fires late)
        wait_for(
            lambda name=name: done_after(db, schema, name, began + timedelta(seconds=3)),  # type: ignore[misc]
            timeout=30,
            what=f"{name}: the skewed replica's fires done",
        )
    sups.append(start(env, *run))
    joined = db_now(db)
    for name in ("every1", "every2"):
        wait_for(
            lambda name=name: done_after(db, schema, name, joined + timedelta(seconds=6)),  # type: ignore[misc]
            timeout=30,
            what=f"{name}: fires done with both replicas up",
        )
    misfires = [
        samples(get(f"{metrics_url(s)}/metrics")[1], "forklift_cron_fires_total",
                outcome="skipped_misfire")
        for s in sups
    ]  # fmt: skip
    cutoff = db_now(db)
    for sup in sups:
        sup.check_alive()
        assert sup.stop(timeout=30) == 0
    for name, every in (("every1", 1), ("every2", 2)):
        fires = [f for f in fired(db, schema, name) if f.at <= cutoff]
        lines = [f"{f.at:%H:%M:%S.%f} x{f.jobs} {f.states} started {f.started}" for f in fires]
        table = f"{name} (database clock at start {began:%H:%M:%S}):\n" + "\n".join(lines)
        print(table)
        assert fires and fires[0].at < joined, table  # the skewed replica fired alone
        steps = {(b.at - a.at).total_seconds() for a, b in itertools.pairwise(fires)}
        assert steps == {every}, table  # none missing
        assert all(f.jobs == 1 for f in fires), table  # none doubled
        for f in fires[:-1]:  # (the last may have been stopped before it started)
            assert f.started is not None and f.at <= f.started <= f.at + LATE, table
    assert misfires == [0, 0]


def test_overlap_false_never_runs_two_fires_at_once_even_those_enqueued_ahead(
    db: psycopg.Connection[Any], schema: str, forklift_cli: Any, tmp_path: Path, env: dict[str, str]
) -> None:
    runs = tmp_path / "runs"
    runs.touch()
    env["FORKLIFT_TEST_RUNS"] = str(runs)  # forklift_cli's processes take `env` as it is now
    args = ("tests.apps.scheduled_clock:slow_app", "--concurrency", "4")
    sup = forklift_cli("run", *args, "--schedule-ahead", "6s")
    wait_for(lambda: len(runs.read_text().splitlines()) >= 3, timeout=60, what="three runs")
    text = get(f"{metrics_url(sup)}/metrics")[1]
    sup.check_alive()
    assert sup.stop(timeout=30) == 0
    spans = sorted(tuple(map(float, line.split()[1:])) for line in runs.read_text().splitlines())
    print("\n".join(f"{a:.3f} .. {b:.3f}" for a, b in spans))
    for (_, end), (begin, _) in itertools.pairwise(spans):
        assert begin >= end, spans  # each run began after the one before ended
    # A five-second job every two seconds: the fires while one runs were skipped.
    assert samples(text, "forklift_cron_fires_total", outcome="skipped_overlap") >= 2
