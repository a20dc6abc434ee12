"""The parts of the claims (the fragments of store/fragments.sql and store/limits.sql),
each run on its own against a real database: what it selects, given a few jobs.

A part of the claim under limits uses the CTEs of the parts before it, so each test runs
those too (`WITH RECURSIVE <parts> SELECT ... FROM <its CTE>`), after limit_lock in the
same transaction, as the claim does, and rolls back.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from importlib import resources
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from forklift import _sql
from forklift.store import ClaimedJob

OWNER = "host:1:w"
LOST = "gone:1:ff"  # a lease owner no liveness lock vouches for

# The parts of job_claim_shared and of job_claim_limited, in the order each puts them.
SHARED = ["_limits_held", "_lane_room"]
LIMITED = [
    "_limits_held",
    "_limits_used",
    "_limited_walks",
    "_limited_heads",
    "_limited_candidates",
    "_limited_admitted",
    "_limited_taken",
    "_limited_again",
]

Run = Callable[[str, str], list[dict[str, Any]]]


def params(**given: Any) -> dict[str, Any]:
    return {
        "queues": ["default"], "tasks": ["t1", "free"], "owner": OWNER, "limit": 10,
        "lease": 30.0, "expired": True, "shared": False, "lanes": 4, "lane_claim": 256,
        "visit": 64, "keys": 32, "rekey": 256, "after_queues": [], "after_tasks": [],
        "after_keys": [], "labels": [], **given,
    }  # fmt: skip


@contextmanager
def limited(db: psycopg.Connection[Any], schema: str, **given: Any) -> Iterator[Run]:
    """In a transaction rolled back after: limit_lock, then `run(part, select)`, the parts
    of the claim under limits (job_claim_shared's or job_claim_limited's) up to and
    including `part`, then `select` from their CTEs."""
    parts = _sql.load_fragments("forklift.store", "limits.sql", schema)
    lock = _sql.load("forklift.store", "limits.sql", schema)["limit_lock"]
    values = params(**given)

    def run(part: str, select: str) -> list[dict[str, Any]]:
        order = SHARED if part in SHARED else LIMITED
        used = order[: order.index(part) + 1]
        sql = "WITH RECURSIVE " + ",\n".join(parts[p] for p in used) + "\n" + select
        return db.cursor(row_factory=dict_row).execute(sql, values).fetchall()

    with db.transaction(force_rollback=True):
        db.execute(lock, values)
        yield run


def fragment(schema: str, name: str) -> str:
    return _sql.load_fragments("forklift.store", "queries.sql", schema)[name]


def jobs(db: psycopg.Connection[Any], schema: str, rows: Sequence[dict[str, Any]]) -> list[int]:
    """Insert jobs (columns as given; a running one with a lease of `lease_owner` that
    ran out a second ago unless `lease_until` is given), in order; their ids."""
    ids = []
    for row in rows:
        row = dict(row)
        if row.get("state") == "running":
            row.setdefault("attempts", 1)
            row.setdefault("started_at", "now()")
        columns = ", ".join(row)
        values = ", ".join(f"{v}" if v in ("now()",) else f"%({k})s" for k, v in row.items())
        if row.get("state") == "running" and "lease_until" not in row:
            columns += ", lease_until"
            values += ", now() - interval '1 second'"
        found = db.execute(
            f"INSERT INTO {schema}.jobs ({columns}) VALUES ({values}) RETURNING id", row
        ).fetchone()
        assert found is not None
        ids.append(int(found[0]))
    return ids


def limit(db: psycopg.Connection[Any], schema: str, **columns: Any) -> int:
    names = ", ".join(columns)
    values = ", ".join(f"%({k})s" for k in columns)
    found = db.execute(
        f"INSERT INTO {schema}.limits ({names}) VALUES ({values}) RETURNING id", columns
    ).fetchone()
    assert found is not None
    return int(found[0])


# -- the parts every claim shares (store/fragments.sql) -----------------------------------


def key_a_full(db: psycopg.Connection[Any], schema: str) -> None:
    """Task t1 under a keyed limit of 1 (key: argument k), key a's one slot taken by a
    job running at OWNER."""
    limit(db, schema, scope="task", name="t1", concurrency=1, keyed=True, key_arg="k")
    jobs(db, schema, [
        {"state": "running", "queue": "default", "task": "t1", "lease_owner": OWNER,
         "lease_until": "2999-01-01", "limit_key": "a"},
    ])  # fmt: skip


def test_claimed_names_each_column_as_the_claimed_job_field_it_fills(
    db: psycopg.Connection[Any], schema: str
) -> None:
    (job,) = jobs(db, schema, [{"queue": "q", "task": "t", "args": '{"a": 1}', "priority": 3}])
    sql = f"SELECT {fragment(schema, '_claimed')} FROM {schema}.jobs AS j WHERE j.id = %s"
    (row,) = db.cursor(row_factory=dict_row).execute(sql, (job,)).fetchall()
    assert list(row) == [f.name for f in dataclasses.fields(ClaimedJob)]
    assert row["id"] == job and row["args"] == {"a": 1} and row["priority"] == 3
    assert row["attempt"] == 0 and row["wait"] >= 0 and row["batch_id"] is None


def test_lease_expired_selects_the_lost_jobs_a_claim_of_these_queues_may_take_back(
    db: psycopg.Connection[Any], schema: str
) -> None:
    db.execute(f"INSERT INTO {schema}.paused_queues (queue, paused_by) VALUES ('held', 't')")
    running = {"state": "running", "task": "t", "lease_owner": LOST, "seen_running": True}
    spent = {**running, "queue": "q", "attempts": 5, "max_attempts": 5}
    lost, *_, unseen, _, gpu, both = jobs(db, schema, [
        {**running, "queue": "q"},
        {**running, "queue": "q", "lease_until": "2999-01-01"},  # its lease runs
        {**running, "queue": "held"},  # paused
        spent,  # no attempt left
        {**running, "queue": "other"},  # not asked for
        {"queue": "q", "task": "t"},  # ready
        {**spent, "seen_running": False},  # no attempt left, but this one is forgiven
        {**spent, "seen_running": False, "leases_forgiven": 3},  # forgiven 3 times already
        {**running, "queue": "q", "requires": "gpu"},  # only a worker with "gpu" takes it
        {**running, "queue": "q", "requires": "gpu,model-x"},
    ])  # fmt: skip
    sql = f"SELECT j.id FROM {schema}.jobs AS j WHERE {fragment(schema, '_lease_expired')}"

    def found(*labels: str) -> list[int]:
        params = {"queues": ["q", "held"], "labels": list(labels)}
        return [r[0] for r in db.execute(sql + " ORDER BY j.id", params)]

    assert found() == [lost, unseen]
    assert found("gpu") == [lost, unseen, gpu]
    assert found("model-x", "gpu", "other") == [lost, unseen, gpu, both]


def test_lease_taken_and_lost_set_a_claimed_job_and_record_a_lost_attempt(
    db: psycopg.Connection[Any], schema: str
) -> None:
    running = {"state": "running", "queue": "q", "task": "t", "lease_owner": LOST}
    ready, lost, unseen, spent = jobs(db, schema, [
        {"queue": "q", "task": "t"},
        {**running, "seen_running": True},  # its handler ran: charged
        running,  # claimed ahead, never started: forgiven
        {**running, "leases_forgiven": 3},  # forgiven 3 times already: charged
    ])  # fmt: skip
    taken, recorded = fragment(schema, "_lease_taken"), fragment(schema, "_lease_lost")
    sql = f"""UPDATE {schema}.jobs AS j SET {taken}, {recorded} WHERE j.id = ANY(%(ids)s)
              RETURNING j.id, j.state::text, j.attempts, j.max_attempts, j.leases_forgiven,
                        j.seen_running, j.lease_owner,
                        j.lease_until > now() + interval '29 seconds', j.last_error,
                        j.errors"""
    with db.transaction(force_rollback=True):
        rows = db.execute(
            sql, {"ids": [ready, lost, unseen, spent], "owner": OWNER, "lease": 30.0}
        ).fetchall()
    by_id = {r[0]: r[1:] for r in rows}
    assert by_id[ready] == ("running", 1, 5, 0, False, OWNER, True, None, [])
    charged = f"LeaseExpired: lease of {LOST} expired"
    forgiven = (
        f"{charged} before its handler was seen running: not charged (an attempt added, "
        "1 of 3 forgiven)"
    )
    # (attempts, max_attempts, leases_forgiven, seen_running, last_error) of each lost one:
    # every one takes the next attempt number (it fences the run's writes); a forgiven
    # one is allowed one attempt more.
    for job_id, expected in [
        (lost, (2, 5, 0, charged)),
        (unseen, (2, 6, 1, forgiven)),
        (spent, (2, 5, 3, charged)),
    ]:
        state, attempts, most, forgiven_n, seen, owner, leased, last_error, errors = by_id[job_id]
        assert (state, owner, leased, seen) == ("running", OWNER, True, False)
        assert (attempts, most, forgiven_n, last_error) == expected
        assert [(e["attempt"], e["worker"], e["error"]) for e in errors] == [(1, LOST, last_error)]


# -- the parts of the claim under limits (store/limits.sql) -------------------------------


def test_limits_held_are_those_locked_and_the_rest_in_force_unheld(
    db: psycopg.Connection[Any], schema: str
) -> None:
    mine = limit(db, schema, scope="task", name="t1", concurrency=2)
    limit(db, schema, scope="task", name="t9", rate=5, per=1.0)
    limit(db, schema, scope="queue", name="default", max_depth=10)  # no limit on claims
    with limited(db, schema) as run:
        held = run("_limits_held", "SELECT h.id, h.name FROM held AS h")
        unheld = run("_limits_held", "SELECT u.scope, u.name FROM unheld AS u")
        (clock,) = run("_limits_held", "SELECT c.at >= now() AS after_start FROM clock AS c")
    assert held == [{"id": mine, "name": "t1"}]
    assert unheld == [{"scope": "task", "name": "t9"}]
    assert clock == {"after_start": True}


@pytest.mark.parametrize(("lane_claim", "room"), [(2, True), (3, False)])
def test_lane_room_says_whether_the_limits_held_have_room_for_every_lane(
    db: psycopg.Connection[Any], schema: str, lane_claim: int, room: bool
) -> None:
    # 2 running under a concurrency of 4: room for one lane of 2 jobs, not one of 3.
    limit(db, schema, scope="task", name="t1", concurrency=4)
    running = {"state": "running", "queue": "default", "task": "t1", "lease_owner": OWNER,
               "lease_until": "2999-01-01"}  # fmt: skip
    jobs(db, schema, [running, running])
    with limited(db, schema, shared=True, lanes=1, lane_claim=lane_claim) as run:
        (said,) = run("_lane_room", "SELECT r.ok, s.exact, s.woke FROM room AS r, said AS s")
    assert said == {"ok": room, "exact": str(not room).lower(), "woke": None}


def test_limits_used_counts_what_runs_per_key_and_finds_the_full_keys(
    db: psycopg.Connection[Any], schema: str
) -> None:
    t1 = limit(db, schema, scope="task", name="t1", concurrency=2, keyed=True, key_arg="k")
    running = {"state": "running", "queue": "default", "task": "t1", "lease_owner": OWNER,
               "lease_until": "2999-01-01"}  # fmt: skip
    jobs(db, schema, [
        {**running, "limit_key": "a"},
        {**running, "args": '{"k": "a"}'},  # keyed by its arguments
        {**running, "limit_key": "b"},
        {"queue": "default", "task": "t1", "limit_key": "c"},  # ready: runs nothing
    ])  # fmt: skip
    with limited(db, schema) as run:
        used = run("_limits_used", "SELECT id, key, running, started FROM used ORDER BY key")
        full = run("_limits_used", "SELECT task, key FROM full_tasks")
    assert used == [
        {"id": t1, "key": "a", "running": 2, "started": 0},
        {"id": t1, "key": "b", "running": 1, "started": 0},
    ]
    assert full == [{"task": "t1", "key": "a"}]


def test_limited_walks_take_each_index_in_line_order_past_full_keys(
    db: psycopg.Connection[Any], schema: str
) -> None:
    key_a_full(db, schema)
    free, unkeyed, full, open_, urgent = jobs(db, schema, [
        {"queue": "default", "task": "free"},
        {"queue": "default", "task": "t1", "args": '{"k": "z"}'},  # its producer knew no limit
        {"queue": "default", "task": "t1", "limit_key": "a"},  # its key runs at its limit
        {"queue": "default", "task": "t1", "limit_key": "b"},
        {"queue": "default", "task": "free", "priority": 5},
    ])  # fmt: skip
    jobs(db, schema, [{"queue": "default", "task": "free", "available_at": "2999-01-01"}])
    with limited(db, schema) as run:
        plain = run("_limited_walks", "SELECT id, key FROM plain")
        walked = run("_limited_walks", "SELECT id FROM walked")
        open_walked = run("_limited_walks", "SELECT id FROM open_walked")
    assert plain == [{"id": urgent, "key": None}, {"id": free, "key": None},
                     {"id": unkeyed, "key": "z"}]  # fmt: skip
    assert walked == [{"id": full}, {"id": open_}]
    assert open_walked == [{"id": open_}]


def test_limited_heads_are_the_first_jobs_of_other_keys_past_a_walk_cut_short(
    db: psycopg.Connection[Any], schema: str
) -> None:
    key_a_full(db, schema)
    # The walk (limit 1 + visit 1) meets only key a's jobs, and a is full.
    jobs(db, schema, [{"queue": "default", "task": "t1", "limit_key": "a"}] * 3)
    b_first, _ = jobs(db, schema, [{"queue": "default", "task": "t1", "limit_key": "b"}] * 2)
    with limited(db, schema, limit=1, visit=1) as run:
        cut = run("_limited_heads", "SELECT queue FROM cut")
        looked = run("_limited_heads", "SELECT queue, task, key FROM looked")
        heads = run("_limited_heads", "SELECT id, key FROM heads")
    assert cut == [{"queue": "default"}]
    assert looked == [{"queue": "default", "task": "t1", "key": "a"},
                      {"queue": "default", "task": "t1", "key": "b"}]  # fmt: skip
    assert heads == [{"id": b_first, "key": "b"}]


def test_limited_candidates_are_the_open_jobs_and_the_lost_ones_with_their_limits(
    db: psycopg.Connection[Any], schema: str
) -> None:
    t1 = limit(db, schema, scope="task", name="t1", concurrency=5, keyed=True, key_arg="k")
    ready, lost = jobs(db, schema, [
        {"queue": "default", "task": "t1", "limit_key": "a"},
        {"state": "running", "queue": "default", "task": "t1", "lease_owner": LOST,
         "args": '{"k": "b"}'},
    ])  # fmt: skip
    limit(db, schema, scope="task", name="t9", concurrency=1)  # not held: its jobs wait
    jobs(db, schema, [{"queue": "default", "task": "t9", "limit_key": ""}])
    with limited(db, schema) as run:
        found = run(
            "_limited_candidates",
            "SELECT id, key, expired, task_limit, queue_limit FROM candidates ORDER BY id",
        )
    assert found == [
        {"id": ready, "key": "a", "expired": False, "task_limit": t1, "queue_limit": None},
        {"id": lost, "key": "b", "expired": True, "task_limit": t1, "queue_limit": None},
    ]


def test_limited_admitted_are_as_many_of_each_key_as_it_has_room_for(
    db: psycopg.Connection[Any], schema: str
) -> None:
    limit(db, schema, scope="task", name="t1", concurrency=1, keyed=True, key_arg="k")
    a_first, _, b_first = jobs(db, schema, [
        {"queue": "default", "task": "t1", "limit_key": "a"},
        {"queue": "default", "task": "t1", "limit_key": "a"},
        {"queue": "default", "task": "t1", "limit_key": "b"},
    ])  # fmt: skip
    with limited(db, schema) as run:
        admitted = run("_limited_admitted", "SELECT id, limited FROM admitted ORDER BY id")
        picked = run("_limited_admitted", "SELECT id FROM picked ORDER BY id")
        share = run("_limited_admitted", "SELECT n FROM share")
    assert admitted == [{"id": a_first, "limited": True}, {"id": b_first, "limited": True}]
    assert picked == [{"id": a_first}, {"id": b_first}]
    assert share == [{"n": 2}]  # no worker registered: all of it, this one's


def test_limited_taken_locks_the_picked_jobs_and_keys_the_unkeyed_it_met(
    db: psycopg.Connection[Any], schema: str
) -> None:
    t1 = limit(db, schema, scope="task", name="t1", rate=10, per=60.0, keyed=True, key_arg="k")
    first, second = jobs(db, schema, [
        {"queue": "default", "task": "t1", "args": '{"k": "x"}'},
        {"queue": "default", "task": "t1", "args": '{"k": "y"}'},
    ])  # fmt: skip
    with limited(db, schema, limit=1) as run:
        taken = run("_limited_taken", "SELECT id FROM taken")
        keyed = db.execute(
            f"SELECT id, limit_key FROM {schema}.jobs WHERE limit_key IS NOT NULL"
        ).fetchall()
        windows = db.execute(
            f"SELECT limit_id, key FROM {schema}.limit_windows ORDER BY key"
        ).fetchall()
    assert taken == [{"id": first}]
    assert keyed == [(second, "y")]  # the one not taken leaves the plain index
    assert windows == [(t1, "x")]  # the one taken counts in its rate window


def test_limited_again_says_where_the_look_at_keys_ended_and_to_claim_again(
    db: psycopg.Connection[Any], schema: str
) -> None:
    key_a_full(db, schema)
    jobs(db, schema, [{"queue": "default", "task": "t1", "limit_key": "a"}] * 3)
    (b_first,) = jobs(db, schema, [{"queue": "default", "task": "t1", "limit_key": "b"}])
    after = {"after_queues": ["default"], "after_tasks": ["t1"], "after_keys": ["a"]}
    with limited(db, schema, limit=2, visit=1, keys=1, **after) as run:
        (row,) = run("_limited_again", "SELECT * FROM cut_short")
        taken = run("_limited_again", "SELECT id FROM taken")
    # Its walk (a's jobs, a full) cut short, it looked at one key from a on (b) and took
    # b's job: more keys may have room, so it claims again, looking on from b.
    assert taken == [{"id": b_first}]
    assert row["again"] is True and row["shared"] is False
    assert (row["after_queues"], row["after_tasks"], row["after_keys"]) == (
        ["default"], ["t1"], ["b"],
    )  # fmt: skip


@pytest.mark.parametrize("name", ["job_claim", "job_claim_shared", "job_claim_limited"])
def test_each_claim_takes_back_lost_jobs_through_the_one_lease_expired_part(
    schema: str, name: str
) -> None:
    file = "queries.sql" if name == "job_claim" else "limits.sql"
    expired = fragment(schema, "_lease_expired")
    assert expired in _sql.load("forklift.store", file, schema)[name]


@pytest.mark.parametrize(
    ("name", "parts"),
    [
        ("job_claim_shared", [*SHARED, "_lease_expired", "_lease_taken", "_lease_lost"]),
        ("job_claim_limited", [*LIMITED, "_lease_taken", "_lease_lost"]),
    ],
)
def test_the_claims_under_limits_are_the_parts_tested_here_in_this_order(
    name: str, parts: list[str]
) -> None:
    text = resources.files("forklift.store").joinpath("limits.sql").read_text("utf-8")
    (written,) = re.findall(rf"(?ms)^-- name: {name}\n(.*?)(?=^-- name: |\Z)", text)
    assert re.findall(r"\{(_\w+)\}", written) == [*parts, "_claimed"]
