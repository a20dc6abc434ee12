"""The operator's store against a real database: queue statistics, empty queues included."""

from __future__ import annotations

import psycopg

import forklift
from forklift.admin import AdminStore


def test_queue_stats_counts_by_state_and_lists_served_queues_even_when_empty(
    dsn: str, schema: str, db: psycopg.Connection[object]
) -> None:
    app = forklift.App(dsn, schema=schema)
    app.enqueue("a", {}, queue="default")
    app.enqueue("a", {}, queue="default", delay=3600)
    done = app.enqueue("a", {}, queue="default")
    dead = app.enqueue("a", {}, queue="default")
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'succeeded', completed_at = now() WHERE id = %s",
        (done,),
    )
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now() WHERE id = %s", (dead,)
    )
    stats = AdminStore(dsn, schema).queue_stats(include=["default", "emails"])
    by_queue = {s.queue: s for s in stats}
    assert [s.queue for s in stats] == ["default", "emails"]
    default, emails = by_queue["default"], by_queue["emails"]
    assert (default.ready, default.scheduled, default.running, default.dead) == (1, 1, 0, 1)
    assert default.oldest_ready_age is not None and default.oldest_ready_age >= 0
    assert (default.succeeded_last_minute, default.dead_last_minute) == (1, 1)
    assert (default.succeeded_last_hour, default.dead_last_hour) == (1, 1)
    assert (emails.ready, emails.dead, emails.oldest_ready_age) == (0, 0, None)
    app.close()


def test_the_queues_in_use_are_those_with_jobs_a_process_or_a_pause(
    dsn: str, schema: str, db: psycopg.Connection[object]
) -> None:
    app = forklift.App(dsn, schema=schema)
    admin = AdminStore(dsn, schema)
    assert admin.queue_known_list() == set()
    by_state = {
        "ready": app.enqueue("a", {}, queue="due"),
        "scheduled": app.enqueue("a", {}, queue="later", delay=3600),
        "running": app.enqueue("a", {}, queue="busy"),
        "dead": app.enqueue("a", {}, queue="failing"),
        "succeeded": app.enqueue("a", {}, queue="finished"),
    }
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'running', lease_owner = 'h:1:x', "
        "lease_until = now() + interval '30 seconds' WHERE id = %s",
        (by_state["running"],),
    )
    for state in ("dead", "succeeded"):
        db.execute(
            f"UPDATE {schema}.jobs SET state = %s::{schema}.job_state, completed_at = now() "
            "WHERE id = %s",
            (state, by_state[state]),
        )
    db.execute(
        f"INSERT INTO {schema}.processes (id, kind, host, pid, queues) "
        "VALUES ('h:2:y', 'worker', 'h', 2, '{served,also}')"
    )
    admin.queue_pause("held")
    assert admin.queue_known_list() == {
        "due", "later", "busy", "failing", "finished", "served", "also", "held",
    }  # fmt: skip
    app.close()
