"""Pausing a queue through the real CLI stops its claims on every replica; resuming
restarts them; the pause shows in queues, status, ps and /metrics."""

from __future__ import annotations

from typing import Any

import psycopg

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import cli, cli_json, get, metrics_url, wait_state


def states(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> list[str]:
    rows = db.execute(
        f"SELECT state FROM {schema}.jobs WHERE id = ANY(%s) ORDER BY id", (ids,)
    ).fetchall()
    return [r[0] for r in rows]


def test_a_paused_queue_is_claimed_by_no_replica_until_it_is_resumed(
    dsn: str, env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    # Two replicas share the queue "mail"; each has a queue of its own beside it.
    one = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--queues", "a,mail")
    two = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--queues", "b,mail")
    running = app.enqueue("sleep", {"seconds": 1.0}, queue="mail")
    wait_state(db, schema, running, "running")
    assert cli_json(env, "queues", "pause", "mail") == {
        "queue": "mail", "action": "pause", "changed": True,
    }  # fmt: skip
    # Older than the jobs below, in priority order before them: a claim that did not
    # skip "mail" would take these first.
    held = [app.enqueue("noop", queue="mail") for _ in range(4)]
    others = [app.enqueue("noop", queue=q) for q in ("a", "b", "a", "b")]
    wait_for(
        lambda: states(db, schema, others) == ["succeeded"] * 4,
        what="each replica claimed its own queue's jobs",
    )
    assert states(db, schema, held) == ["ready"] * 4
    wait_state(db, schema, running, "succeeded")  # what was running when paused finishes
    # Visible everywhere an operator looks.
    [mail] = [q for q in cli_json(env, "queues") if q["queue"] == "mail"]
    assert (mail["paused"], mail["ready"]) == (True, 4) and mail["paused_by"]
    status = cli(env, "status")
    assert any(line.split()[:3] == ["mail", "yes", "4"] for line in status.stdout.splitlines())
    assert "mail(paused)" in cli(env, "ps").stdout
    for sup, own in ((one, "a"), (two, "b")):
        body = get(metrics_url(sup) + "/metrics")[1]
        assert 'forklift_queue_paused{queue="mail"} 1.0' in body
        assert f'forklift_queue_paused{{queue="{own}"}} 0.0' in body
    assert cli(env, "queues", "resume", "mail").stdout.strip() == "queue mail resumed"
    wait_for(lambda: states(db, schema, held) == ["succeeded"] * 4, timeout=5, what="claims again")
    for sup in (one, two):
        sup.stop_cleanly(timeout=30)
    app.close()


def test_pausing_a_queue_nobody_uses_is_refused_with_the_close_names_unless_forced(
    dsn: str, env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    app.enqueue("noop", queue="emails")  # jobs, no worker yet
    worker = forklift_cli("worker", "tests.apps.basic:app", "--queues", "reports")  # no jobs
    wait_for(
        lambda: any(p["queues"] == ["reports"] for p in cli_json(env, "ps")),
        what="the worker registered",
    )
    for typo, meant in (("emials", "emails"), ("report", "reports")):
        result = cli(env, "queues", "pause", typo)
        assert result.returncode == 1, result.stderr
        assert result.stderr.strip() == (
            f"forklift: error: queue '{typo}' has no jobs and no worker serves it (did you "
            f"mean '{meant}'?); to pause it anyway (ahead of a deploy that brings its "
            "workers), pass --force"
        )
    assert [q["queue"] for q in cli_json(env, "queues")] == ["emails"]  # no phantom row
    assert "emials" not in cli(env, "status").stdout
    for queue in ("emails", "reports"):
        assert cli_json(env, "queues", "pause", queue)["changed"] is True
    result = cli(env, "queues", "pause", "video")
    assert result.returncode == 1 and "--force" in result.stderr
    assert "did you mean" not in result.stderr  # nothing close
    assert cli_json(env, "queues", "pause", "video", "--force")["changed"] is True
    assert cli(env, "queues", "resume", "emials").stdout.strip() == (
        "queue emials was not paused (did you mean 'emails'?)"
    )
    worker.stop_cleanly(timeout=30)
    app.close()
