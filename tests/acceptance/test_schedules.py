"""Schedules with the real `forklift run`: replicas, a killed one, downtime, failures.

Fire times are read back from the jobs: each scheduled job runs at its fire time
(`available_at`), under a key made of the schedule's name and that time, and was
enqueued ahead of it (`created_at` before it) unless it was a catch-up after downtime.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from forklift.testing import wait_for
from tests.acceptance.conftest import get, metrics_url
from tests.acceptance.test_observability import samples

SECOND = timedelta(seconds=1)


@dataclass(frozen=True)
class Fired:
    at: datetime  # the fire time (the job's available_at)
    jobs: int  # jobs with that fire time
    late: bool  # enqueued after its fire time: a catch-up
    states: str


def fired(db: psycopg.Connection[Any], schema: str, name: str) -> list[Fired]:
    rows = db.execute(
        f"SELECT available_at, count(*), bool_or(created_at > available_at),"
        f" string_agg(state::text, ',')"
        f" FROM {schema}.jobs WHERE idempotency_key LIKE %s"
        f" GROUP BY available_at ORDER BY available_at",
        (f"forklift:schedule:{name}:%",),
    ).fetchall()
    return [Fired(*r) for r in rows]


def gaps(fires: list[Fired]) -> list[tuple[datetime, datetime]]:
    """(before, after) for each pair of consecutive fire times more than a second apart."""
    return [(a.at, b.at) for a, b in itertools.pairwise(fires) if b.at - a.at != SECOND]


def due_count(db: psycopg.Connection[Any], schema: str, name: str) -> int:
    """Fire times of `name` that have come and whose job has finished."""
    return sum(1 for f in fired(db, schema, name) if f.states == "succeeded")


def table(fires: list[Fired]) -> str:
    lines = ["fire time (UTC)           jobs  enqueued  state"]
    for f in fires:
        when = "late" if f.late else "ahead"
        lines.append(f"{f.at:%Y-%m-%d %H:%M:%S}Z     {f.jobs:>4}  {when:<8}  {f.states}")
    return "\n".join(lines)


def test_three_replicas_fire_each_time_once_even_when_one_is_killed(
    db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    # Six seconds ahead, not the default three: on a loaded 2-core machine a replica's
    # round can stall past three seconds, and "ahead" is what this test checks.
    run = ("run", "tests.apps.scheduled:app", "--workers", "1", "--schedule-ahead", "6s")
    sups = [forklift_cli(*run) for _ in range(3)]
    urls = [metrics_url(s) for s in sups]
    wait_for(lambda: due_count(db, schema, "tick") >= 10, timeout=30, what="ten ticks done")
    enqueued = [samples(get(f"{u}/metrics")[1], "forklift_cron_fires_total", outcome="enqueued")
                for u in urls]  # fmt: skip
    sups[0].kill_session()  # the supervisor and its worker, no goodbye
    killed_at = time.time()
    wait_for(
        lambda: fired(db, schema, "tick")[-1].at.timestamp() > killed_at + 9,
        timeout=20,
        what="nine more seconds of fire times",  # six of them enqueued ahead
    )
    for sup in sups[1:]:
        sup.check_alive()
        assert sup.stop(timeout=30) == 0
    for name in ("tick", "tick-catchup"):
        fires = fired(db, schema, name)
        print(f"\n{name}: replicas' enqueued counts before the kill {enqueued}\n{table(fires)}")
        assert len(fires) >= 16
        assert gaps(fires) == [], table(fires)  # none missing, the kill included
        assert all(f.jobs == 1 for f in fires), table(fires)  # one job each
        assert not any(f.late for f in fires), table(fires)  # each enqueued ahead
    assert sum(enqueued) > 0


def test_after_downtime_one_catch_up_fire_by_default_and_every_missed_with_catchup(
    db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    first = forklift_cli("run", "tests.apps.scheduled:app", "--workers", "1")
    wait_for(lambda: due_count(db, schema, "tick") >= 3, timeout=30, what="three ticks done")
    assert first.stop(timeout=30) == 0
    before = {name: fired(db, schema, name)[-1].at for name in ("tick", "tick-catchup")}
    time.sleep(5)  # the downtime itself: no replica runs
    second = forklift_cli("run", "tests.apps.scheduled:app", "--workers", "1")
    restarted_at = time.time()
    wait_for(
        lambda: (
            fired(db, schema, "tick")[-1].at.timestamp() > restarted_at + 4
            and fired(db, schema, "tick-catchup")[-1].at.timestamp() > restarted_at + 4
        ),
        timeout=20,
        what="fire times after the restart",
    )
    assert second.stop(timeout=30) == 0

    tick = fired(db, schema, "tick")
    print(f"\ntick (default policy), last fire before the stop {before['tick']}\n{table(tick)}")
    after = [f for f in tick if f.at > before["tick"]]
    assert [f.late for f in after].count(True) == 1, table(tick)  # one catch-up fire
    assert after[0].late and after[0].at - before["tick"] > SECOND, table(tick)  # some missed
    assert gaps(tick) == [(before["tick"], after[0].at)], table(tick)  # and no other gap

    caught = fired(db, schema, "tick-catchup")
    print(f"\ntick-catchup, last fire before the stop {before['tick-catchup']}\n{table(caught)}")
    # The missed fire times ran late, after the restart. (A fire before the stop can be
    # late too on a loaded machine, a round stalled past the three seconds ahead: that is
    # no catch-up, and the gaps say whether anything was missed.)
    late = [f for f in caught if f.late and f.at > before["tick-catchup"]]
    assert gaps(caught) == [], table(caught)  # every missed fire time ran
    assert len(late) >= 2, table(caught)
    assert all(f.jobs == 1 for f in tick + caught)


def schedules_json(env: dict[str, str]) -> dict[str, dict[str, Any]]:
    result = subprocess.run(
        [sys.executable, "-m", "forklift", "schedules", "--json"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return {s["name"]: s for s in json.loads(result.stdout)}


def test_a_failing_scheduled_job_retries_like_any_job_and_its_schedule_says_so(
    db: psycopg.Connection[Any], schema: str, env: dict[str, str], forklift_cli: Any
) -> None:
    sup = forklift_cli("run", "tests.apps.scheduled_failures:app", "--workers", "1")

    def settled() -> dict[str, dict[str, Any]] | None:
        found = schedules_json(env)
        flaky, doomed = found.get("flaky", {}), found.get("doomed", {})
        return found if flaky.get("last_success_utc") and doomed.get("last_error") else None

    found = wait_for(settled, timeout=30, what="a success and a dead job recorded")
    flaky = fired(db, schema, "flaky")
    retried = db.execute(
        f"SELECT attempts, state::text, errors->0->>'error' FROM {schema}.jobs"
        f" WHERE idempotency_key = %s",
        (f"forklift:schedule:flaky:{flaky[0].at:%Y-%m-%dT%H:%M:%SZ}",),
    ).fetchone()
    assert retried is not None and retried[:2] == (2, "succeeded")
    assert "the first attempt fails" in retried[2]
    assert "RuntimeError: doomed to fail" in found["doomed"]["last_error"]
    assert found["flaky"]["every_seconds"] == 2 and found["flaky"]["declared"] is True
    assert found["flaky"]["next_fire_utc"].endswith("Z")
    text = get(f"{metrics_url(sup)}/metrics")[1]
    assert samples(text, "forklift_cron_last_success_timestamp_seconds", schedule="flaky") > 0
    assert samples(text, "forklift_cron_fires_total", schedule="doomed", outcome="enqueued") > 0
    assert samples(text, "forklift_cron_interval_seconds", schedule="flaky") == 2
    # The worker counts a death once its statement returns, just after the commit that
    # `forklift schedules` saw: the count may trail the database by that much.
    wait_for(
        lambda: samples(
            get(f"{metrics_url(sup)}/metrics")[1], "forklift_jobs_total", task="doomed",
            outcome="dead",
        ) > 0,
        timeout=5, what="the dead doomed job counted",
    )  # fmt: skip

    table = subprocess.run(
        [sys.executable, "-m", "forklift", "schedules"],
        env=env, capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    lines = table.splitlines()
    assert lines[0].split()[:4] == ["schedule", "task", "when", "zone"]
    assert any(line.startswith("doomed") and "doomed to fail" in line for line in lines)
    assert any(line.startswith("flaky") and "every 2s" in line for line in lines)
    assert sup.stop(timeout=30) == 0
