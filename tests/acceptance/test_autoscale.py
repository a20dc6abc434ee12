"""`forklift run --autoscale MIN:MAX` with real fork: a backlog grows the pool up to MAX,
never past it, and idleness shrinks it back to MIN."""

from __future__ import annotations

import re
from typing import Any

import psycopg

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import scalar


def test_a_backlog_scales_up_to_max_and_idleness_back_down(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--autoscale", "1:3", "--autoscale-idle", "1")
    wait_for(lambda: len(sup.children()) == 1, what="the minimum of one child")
    app = forklift.App(dsn, schema=schema)
    seen: list[int] = []

    def count() -> int:
        n = len(sup.children())
        seen.append(n)
        return n

    # 24 one-second jobs: with one child they would take 24 s, so the backlog outlasts
    # the climb to three (one step per 2 s autoscale tick while every child is busy).
    ids = app.enqueue_many([("sleep", {"seconds": 1.0}) for _ in range(24)])
    wait_for(lambda: count() == 3, timeout=20, what="three children")

    def done() -> bool:
        count()
        succeeded = scalar(
            db,
            f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded' AND id = ANY(%s)",
            ids,
        )
        return bool(succeeded == len(ids))

    wait_for(done, timeout=20, what="the backlog done")
    wait_for(lambda: count() == 1, timeout=20, what="back down to one child")
    assert max(seen) == 3, seen

    targets = [int(n) for n in re.findall(r"supervisor\.scale workers=(\d+)", sup.output())]
    assert targets == [2, 3, 2, 1], sup.output()
    assert re.search(r"supervisor\.started pid=\d+ workers=1 ", sup.output()), sup.output()
    assert "child.killing" not in sup.output() and "restart_backoff" not in sup.output()

    sup.stop_cleanly(timeout=15)
    assert sup.output().count("child.started") == 3
    assert sup.output().count("reason=clean exit") == 3
    assert sup.output().count("retiring=scale down") == 2
    app.close()
