"""/metrics stays small whatever producers write: thousands of queues nobody here serves
and thousands of task names the app does not know add no series."""

from __future__ import annotations

from typing import Any

import psycopg

import forklift
from forklift.metrics import UNKNOWN_TASK
from forklift.testing import wait_for
from tests.acceptance.conftest import get, metrics_url, scalar


def series(text: str) -> list[str]:
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def test_unserved_queues_and_unknown_tasks_do_not_grow_the_metrics(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    producer = forklift.App(dsn, schema=schema)  # no tasks: it may enqueue any name
    producer.enqueue_many(forklift.JobSpec("noop", {}, queue=f"elsewhere-{i}") for i in range(3000))
    unknown = 1000
    producer.enqueue_many(
        forklift.JobSpec(f"typo-{i}", {}, queue="default") for i in range(unknown)
    )
    producer.enqueue("noop")
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    url = metrics_url(sup)
    wait_for(
        lambda: (
            scalar(
                db, f"SELECT count(*) FROM {schema}.jobs WHERE queue = 'default' AND state = 'dead'"
            )
            == unknown
        ),
        timeout=60,
        what="the unknown tasks' jobs dead",
    )

    def counted() -> str | None:
        text = get(url + "/metrics")[1]
        return text if f'task="{UNKNOWN_TASK}"' in text and 'queue="default"' in text else None

    text = wait_for(counted, timeout=20, what="the dead jobs counted")
    lines = series(text)
    print(f"/metrics: {len(lines)} series, {len(text)} bytes")
    assert not [line for line in lines if "elsewhere-" in line]
    assert not [line for line in lines if "typo-" in line]
    assert len(lines) < 300, len(lines)
    sup.stop_cleanly(timeout=30)
    producer.close()
