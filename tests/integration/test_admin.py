"""The operator's store against a real database: queue statistics, empty queues included."""

from __future__ import annotations

import psycopg

import forklift
from forklift.admin import AdminStore, LimitChange, LimitRow


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


def test_a_queues_limits_change_one_by_one_and_a_new_per_resets_the_rate_window(
    dsn: str, schema: str, db: psycopg.Connection[object]
) -> None:
    admin = AdminStore(dsn, schema)
    set_ = admin.queue_limit_set
    now = set_("mail", LimitChange(frozenset({"concurrency", "rate"}), 2, 10, 1.0))
    assert now == LimitRow("queue", "mail", 2, 10, 1.0)
    row = db.execute(f"SELECT id FROM {schema}.limits WHERE name = 'mail'").fetchone()
    assert isinstance(row, tuple)
    limit_id = row[0]
    window = f"SELECT count(*) FROM {schema}.limit_windows WHERE limit_id = %s"
    db.execute(
        f"INSERT INTO {schema}.limit_windows (limit_id, key, newest, counts) "
        "VALUES (%s, '', 1, '{10}')",
        (limit_id,),
    )
    # The same per: the starts counted so far still count against the lower rate.
    assert set_("mail", LimitChange(frozenset({"rate"}), rate=5, per=1.0)) == LimitRow(
        "queue", "mail", 2, 5, 1.0
    )
    assert db.execute(window, (limit_id,)).fetchone() == (1,)
    now = set_("mail", LimitChange(frozenset({"rate", "max_depth"}), rate=5, per=60.0, max_depth=9))
    assert now == LimitRow("queue", "mail", 2, 5, 60.0, max_depth=9)
    assert db.execute(window, (limit_id,)).fetchone() == (0,)  # hundredths of a second: gone
    stats = {s.queue: s for s in admin.queue_stats(throughput=False)}
    assert stats["mail"].limits() == "concurrency 2, 5/60s, max depth 9"
    assert "mail" in admin.queue_known_list()
    gone = LimitChange(frozenset({"concurrency", "rate", "max_depth"}))
    assert set_("mail", gone) is None  # nothing left in force: no row
    assert admin.limit_list() == [] and admin.queue_limit_clear("mail") is None
