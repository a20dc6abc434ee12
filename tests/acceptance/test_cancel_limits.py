"""A cancelled job keeps its limit's slot until its handler has stopped (a limit is never
exceeded, not even briefly), through the real CLI: a handler deaf to its cancel runs on,
returning by itself or killed at --cancel-grace, and the next job of its key starts only
after it stopped.

"At once" is read from the handlers' own start and end times (`{schema}.runs`, written by
tests/apps/limited.py's `stubborn`), never from claim rows."""

from __future__ import annotations

import functools
import json
from typing import Any

import psycopg
import pytest

from forklift.admin import JobAdmin
from forklift.testing import wait_for
from tests.acceptance.conftest import cli, scalar
from tests.apps.limited import RUNS

APP = "tests.apps.limited:app"


def enqueue(env: dict[str, str], k: str, seconds: float) -> int:
    result = cli(
        env, "enqueue", APP, "stubborn", "--args", json.dumps({"k": k, "seconds": seconds})
    )
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def runs(db: psycopg.Connection[Any], schema: str) -> list[tuple[Any, ...]]:
    """(job id, pid, started, ended) of every run, by start."""
    return db.execute(
        f"SELECT job_id, pid, started, ended FROM {schema}.runs ORDER BY started"
    ).fetchall()


def most_at_once(spans: list[tuple[Any, ...]]) -> int:
    """The most runs whose [started, ended] overlap at one moment."""
    edges = sorted([(s, 1) for _, _, s, _ in spans] + [(e, -1) for _, _, _, e in spans])
    now = most = 0
    for _, step in edges:  # at a tie an end sorts first: touching runs do not overlap
        now += step
        most = max(most, now)
    return most


@pytest.mark.parametrize(
    ("grace", "seconds", "lease"),
    [
        pytest.param("30", 3.0, "30", id="handlers-return-by-themselves"),
        # Each runs past a lease: its hold is renewed meanwhile, or it would lapse.
        pytest.param("30", 7.0, "3", id="handlers-outlast-their-lease"),
        pytest.param("1", 8.0, "30", id="handlers-killed-at-the-grace"),
    ],
)
def test_cancelled_handlers_still_running_keep_their_keys_slot(
    env: dict[str, str],
    dsn: str,
    db: psycopg.Connection[Any],
    schema: str,
    forklift_cli: Any,
    grace: str,
    seconds: float,
    lease: str,
) -> None:
    db.execute(RUNS.format(schema=schema))
    admin = JobAdmin(dsn, schema)
    ids = [enqueue(env, "a", seconds) for _ in range(4)]  # before the supervisor: in line
    sup = forklift_cli(
        "run", APP, "--workers", "2", "--concurrency", "4", "--cancel-grace", grace,
        "--lease", lease,
    )  # fmt: skip
    # Each of the first three is cancelled as soon as its handler has started.
    for job_id in ids[:3]:
        wait_for(
            functools.partial(scalar, db, f"SELECT count(*) FROM {schema}.runs WHERE job_id = %s",
                              job_id),
            timeout=30, interval=0.05, what=f"job {job_id} started",
        )  # fmt: skip
        [acted] = admin.job_cancel_many([job_id])  # at once (the CLI's own process is slower)
        assert acted.done, acted
    wait_for(
        lambda: scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", ids[3])
        == "succeeded",
        timeout=60, what="the last job done",
    )  # fmt: skip
    spans = runs(db, schema)
    assert list(dict.fromkeys(s[0] for s in spans)) == ids, spans  # in line
    assert most_at_once(spans) == 1, "\n".join(map(str, spans))
    states = db.execute(
        f"SELECT state::text FROM {schema}.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    assert [s for (s,) in states] == ["cancelled"] * 3 + ["succeeded"]
    # No hold is left behind: the handlers that stopped, or their dead workers, let go.
    held = f"SELECT count(*) FROM {schema}.jobs WHERE stopping_owner IS NOT NULL"
    wait_for(lambda: scalar(db, held) == 0, timeout=10, what="every hold let go")
    sup.stop_cleanly(timeout=30)
