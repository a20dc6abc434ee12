"""What the dashboard tests (and screenshots) show: a realistic system, and rows written
by hostile producers and hosts. Jobs go in through the producer API where it allows them;
states, errors, processes and schedules are written as workers and schedulers write
them, in SQL; hostile names, which enqueue refuses, in raw SQL as a producer bypassing
forklift might."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

import forklift

TRACEBACK = """Traceback (most recent call last):
  File "/srv/app/jobs.py", line 41, in send_receipt
    smtp.send(message)
  File "/usr/lib/python3.11/smtplib.py", line 897, in send
    raise SMTPServerDisconnected("Connection unexpectedly closed")
smtplib.SMTPServerDisconnected: Connection unexpectedly closed"""

# What hostile producers, handlers and hosts write: markup, ANSI escapes, bidi overrides.
SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
ANSI = "\x1b[2J\x1b[31mFAKE: all queues healthy\x1b]0;pwned\x07"
BIDI = "evil\u202etxt.exe"
SECRET = "hunter2-s3cret"  # must appear on no page


@dataclass(frozen=True)
class Seeded:
    dead: list[int]  # dead jobs with an error history, newest last
    running: list[int]
    batch: int
    images: int  # ready jobs in queue "images"
    hostile_job: int = 0
    hostile_batch: int = 0


def seed(dsn: str, schema: str) -> Seeded:
    app = forklift.App(dsn, schema=schema)
    images = app.enqueue_many(
        forklift.JobSpec("resize", {"path": f"photos/{i:04d}.jpg", "width": 640}, queue="images")
        for i in range(120)
    )
    for i in range(8):
        args = {"order": 1000 + i, "to": f"buyer{i}@example.com", "smtp_password": SECRET}
        app.enqueue("send_receipt", args, queue="emails")
    for i in range(5):
        app.enqueue("build_report", {"month": f"2026-{i + 1:02d}"}, queue="reports", delay=3600)
    batch = app.enqueue_batch(
        [("render_tile", {"tile": t, "zoom": 3}) for t in range(40)],
        on_complete="assemble",
        on_complete_args={"out": "s3://maps/z3.png", "dsn": f"postgresql://u:{SECRET}@db/x"},
    )
    with psycopg.connect(dsn, autocommit=True) as db:
        dead = _kill(db, schema, "emails", 3)
        _checkpoint(db, schema, dead[-1])
        running = _run(db, schema, images[:3])
        _batch_progress(db, schema, batch.id)
        _processes(db, schema)
        _schedules(db, schema)
        _history(db, schema)
    return Seeded(dead, running, batch.id, len(images))


def _kill(db: psycopg.Connection[Any], schema: str, queue: str, n: int) -> list[int]:
    """`n` jobs of `queue` dead after 5 attempts, each failure in their error history."""
    now = datetime.now(UTC)
    errors = [
        {"attempt": a, "at": (now - timedelta(minutes=12 - 2 * a)).isoformat(),
         "worker": f"web-2:770{a % 2 + 1}:ab12@7700.s2",
         "error": "SMTPServerDisconnected: Connection unexpectedly closed", "traceback": TRACEBACK}
        for a in range(1, 6)
    ]  # fmt: skip
    rows = db.execute(
        f"""UPDATE {schema}.jobs SET state = 'dead', attempts = 5, errors = %s::jsonb,
               last_error = 'SMTPServerDisconnected: Connection unexpectedly closed',
               created_at = now() - interval '12 minutes',
               available_at = now() - interval '4 minutes',
               started_at = now() - interval '2 minutes 1 second',
               completed_at = now() - interval '2 minutes'
           WHERE id IN (SELECT id FROM {schema}.jobs WHERE queue = %s ORDER BY id LIMIT %s)
           RETURNING id""",
        (json.dumps(errors), queue, n),
    ).fetchall()
    return sorted(r[0] for r in rows)


# What a resumable job's worker wrote before it died (migration 0018).
CHECKPOINT = {
    "v": 3, "cursors": {"recipients": 41}, "steps": {"render": "ok", "attach": "ok"},
    "state": {"sent": 41, "smtp_password": SECRET}, "ran": 95.0,
}  # fmt: skip


def _checkpoint(db: psycopg.Connection[Any], schema: str, job_id: int) -> None:
    db.execute(
        f"""UPDATE {schema}.jobs SET checkpoint = %s::jsonb,
               checkpoint_at = now() - interval '2 minutes 5 seconds' WHERE id = %s""",
        (json.dumps(CHECKPOINT), job_id),
    )


def _run(db: psycopg.Connection[Any], schema: str, ids: list[int]) -> list[int]:
    for n, job_id in enumerate(ids):
        progress = {"done": 30 * (n + 1), "total": 100, "message": "resizing",
                    "at": "2026-12-01T10:00:00+00:00"}  # fmt: skip
        db.execute(
            f"""UPDATE {schema}.jobs SET state = 'running', attempts = 1,
                   lease_owner = %s, lease_until = now() + interval '30 seconds',
                   started_at = now() - make_interval(secs => %s), progress = %s::jsonb
               WHERE id = %s""",
            (f"web-1:{4101 + n}:w{n}@4100.s1", 5 + 20 * n, json.dumps(progress), job_id),
        )
    return ids


def _batch_progress(db: psycopg.Connection[Any], schema: str, batch: int) -> None:
    """Of the batch's 40 tiles: 25 succeeded, 2 dead, 1 running (on web-2), 12 ready."""
    db.execute(
        f"""UPDATE {schema}.jobs SET
               state = (CASE WHEN n <= 25 THEN 'succeeded' ELSE 'dead' END)::{schema}.job_state,
               attempts = 1, started_at = now() - interval '40 seconds',
               completed_at = now() - make_interval(secs => 40 - n),
               last_error = CASE WHEN n > 25 THEN 'MemoryError: tile too large' END
           FROM (SELECT id, row_number() OVER (ORDER BY id) AS n FROM {schema}.jobs
                 WHERE batch_id = %s) AS t
           WHERE {schema}.jobs.id = t.id AND t.n <= 27""",
        (batch,),
    )
    db.execute(
        f"""UPDATE {schema}.jobs SET state = 'running', attempts = 1,
               lease_owner = 'web-2:7701:w0@7700.s2', lease_until = now() + interval '30 seconds',
               started_at = now() - interval '4 seconds',
               progress = '{{"done": 3, "total": 4, "message": "shading"}}'::jsonb
           WHERE id = (SELECT max(id) FROM {schema}.jobs WHERE batch_id = %s)""",
        (batch,),
    )


def _processes(db: psycopg.Connection[Any], schema: str) -> None:
    rows = [
        ("web-1:4100:s1", "supervisor", "web-1", 4100, None, ["default", "images"]),
        ("web-1:4101:w0@4100.s1", "worker", "web-1", 4101, "web-1:4100:s1", ["default", "images"]),
        ("web-1:4102:w1@4100.s1", "worker", "web-1", 4102, "web-1:4100:s1", ["default", "images"]),
        ("web-1:4103:w2@4100.s1", "worker", "web-1", 4103, "web-1:4100:s1", ["default", "images"]),
        ("web-2:7700:s2", "supervisor", "web-2", 7700, None, ["default", "emails", "reports"]),
        (
            "web-2:7701:w0@7700.s2",
            "worker",
            "web-2",
            7701,
            "web-2:7700:s2",
            ["default", "emails", "reports"],
        ),
    ]
    for id_, kind, host, pid, sup, queues in rows:
        labels = ["gpu"] if host == "web-2" else []  # forklift run --labels gpu
        db.execute(
            f"""INSERT INTO {schema}.processes (id, kind, host, pid, supervisor_id, queues,
                   rss_bytes, started_at, labels) VALUES (%s, %s, %s, %s, %s, %s, %s,
                   now() - interval '2 hours', %s)""",
            (id_, kind, host, pid, sup, queues, 80 * 2**20, labels),
        )
    # Two jobs whose task requires labels no registered worker has: "2 no worker".
    db.execute(
        f"""INSERT INTO {schema}.jobs (queue, task, args, requires)
           SELECT 'media', 'transcribe', '{{}}', 'gpu,whisper' FROM generate_series(1, 2)"""
    )


def _schedules(db: psycopg.Connection[Any], schema: str) -> None:
    db.execute(
        f"""INSERT INTO {schema}.schedules (name, task, queue, cron, every_seconds, tz, overlap,
               definition_hash, defined_at, fired_through, next_fire_at, last_fire_at,
               last_success_at, last_error, last_error_at)
           VALUES ('nightly-reindex', 'reindex', 'default', '0 3 * * *', NULL, 'Europe/Zagreb',
                   false, 'h1', now() - interval '3 days', now(), now() + interval '5 hours',
                   now() - interval '19 hours', now() - interval '19 hours', NULL, NULL),
                  ('poll-feeds', 'poll_feeds', 'default', NULL, 300, 'UTC', false, 'h2',
                   now() - interval '1 day', now(), now() + interval '4 minutes',
                   now() - interval '1 minute', now() - interval '6 minutes',
                   'TimeoutError: feed did not answer', now() - interval '1 minute')"""
    )


def _history(db: psycopg.Connection[Any], schema: str) -> None:
    """A working system's last hour: done and dead jobs in every minute, for the charts."""
    db.execute(
        f"""INSERT INTO {schema}.jobs (queue, task, state, attempts, created_at, started_at,
               completed_at, last_error)
           SELECT 'images', 'resize',
                  (CASE WHEN i % 40 = 0 THEN 'dead' ELSE 'succeeded' END)::{schema}.job_state, 1,
                  c - interval '2 seconds', c - interval '1 second', c,
                  CASE WHEN i % 40 = 0 THEN 'OSError: truncated image' END
           FROM generate_series(1, 3000) AS i,
           LATERAL (SELECT now() - make_interval(secs => (3001 - i) * 1.2 + 20 * sin(i / 50.0))
                    AS c) AS t"""
    )


def hostile(dsn: str, schema: str) -> tuple[int, int]:
    """Rows that every hostile string reaches: a job (task, queue, key, args, error,
    traceback, worker, progress, checkpoint), a process (host, queues), a schedule, a
    batch (callback task and args), a paused queue. Returns the job's and the batch's
    ids."""
    args = {SCRIPT: IMG, "note": ANSI, "file": BIDI, "api_key": SECRET, IMG: [SCRIPT, BIDI]}
    traceback = f"Traceback\n  {IMG}\n{ANSI}\n{BIDI}"
    errors = [{"attempt": 1, "at": "2026-12-01T10:00:00Z", "worker": IMG,
               "error": f"{SCRIPT} {ANSI}", "traceback": traceback}]  # fmt: skip
    with psycopg.connect(dsn, autocommit=True) as db:
        batch = db.execute(
            f"""INSERT INTO {schema}.batches (total, sealed_at, callback)
               VALUES (1, now(), %s::jsonb) RETURNING id""",
            (json.dumps({"task": SCRIPT, "queue": IMG, "args": {SCRIPT: ANSI, "token": SECRET},
                         "priority": 0, "max_attempts": 1, "max_crashes": 1, "timeout": None}),),
        ).fetchone()  # fmt: skip
        assert batch is not None
        job = db.execute(
            f"""INSERT INTO {schema}.jobs (queue, task, args, idempotency_key, state, attempts,
                   max_attempts, errors, last_error, completed_at, batch_id, progress, result)
               VALUES (%s, %s, %s::jsonb, %s, 'dead', 1, 1, %s::jsonb, %s, now(), %s, %s::jsonb,
                       %s::jsonb)
               RETURNING id""",
            (IMG, SCRIPT, json.dumps(args), BIDI + ANSI, json.dumps(errors),
             f"{SCRIPT} {ANSI} {BIDI}", batch[0],
             json.dumps({"done": 1, "total": 2, "message": IMG + ANSI}),
             json.dumps({SCRIPT: BIDI, "password": SECRET})),
        ).fetchone()  # fmt: skip
        assert job is not None
        checkpoint = {"v": 1, "cursors": {IMG: ANSI}, "steps": {SCRIPT: BIDI},
                      "state": {SCRIPT: BIDI, "token": SECRET}}  # fmt: skip
        db.execute(
            f"UPDATE {schema}.jobs SET checkpoint = %s::jsonb, checkpoint_at = now() WHERE id = %s",
            (json.dumps(checkpoint), job[0]),
        )
        db.execute(
            f"""INSERT INTO {schema}.jobs (queue, task, state, attempts, lease_owner,
                   lease_until, started_at, progress)
               VALUES (%s, %s, 'running', 1, %s, now() + interval '30 seconds', now(),
                       %s::jsonb)""",
            (SCRIPT, IMG, f"{IMG}:1:x", json.dumps({"done": 1, "total": 3, "message": BIDI})),
        )
        db.execute(
            f"""INSERT INTO {schema}.processes (id, kind, host, pid, queues)
               VALUES (%s, 'worker', %s, 1, %s)""",
            (f"{IMG}:1:x", IMG + ANSI, [SCRIPT, BIDI]),
        )
        db.execute(
            f"""INSERT INTO {schema}.schedules (name, task, queue, cron, tz, overlap,
                   definition_hash, defined_at, fired_through, last_error, last_error_at)
               VALUES (%s, %s, %s, %s, 'UTC', false, 'h', now(), now(), %s, now())""",
            (SCRIPT, IMG, BIDI, ANSI, f"{SCRIPT}{ANSI}"),
        )
        db.execute(
            f"INSERT INTO {schema}.paused_queues (queue, paused_by) VALUES (%s, %s)",
            (IMG, SCRIPT),
        )
    return job[0], batch[0]
