"""Every operator and metrics query reads the jobs table through an index, never a
sequential scan: checked by EXPLAIN on a table holding a day of retained finished jobs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import psycopg
import psycopg.sql
import pytest

from forklift import _sql

FINISHED = 200_000  # a day of retained jobs, completed_at spread over the last 24 h
CHUNK = 1_000_000  # finished rows per INSERT while filling

# Realistic parameters for the queries that take any; every other query takes none.
# A query added without an entry here fails on its missing parameters, not silently.
PARAMS: dict[str, list[dict[str, Any]]] = {
    "queue_finished": [{"window": 60.0}, {"window": 3600.0}],
    "queue_depth": [{"cap": 10_000}],
    "queue_pause": [{"queue": "q1", "by": "op@host"}],
    "queue_resume": [{"queue": "q1"}],
    "queue_limit_lock": [{"queue": "q1"}],
    "queue_limit_set": [
        {
            "queue": "q1",
            "concurrency": 4,
            "rate": 10,
            "per": 1.0,
            "max_depth": None,
            "set_concurrency": True,
            "set_rate": True,
            "set_max_depth": False,
        }
    ],
    "limit_window_reset": [{"id": 1}],
    "queue_limit_clear": [{"queue": "q1"}],
    "job_list": [
        {"state": s, "scheduled": later, "queue": q, "task": None, "error": e, "before": None}
        for s, later, q, e in [
            (None, False, None, None),
            (None, False, "q1", None),
            ("dead", False, None, "%boom%"),
            ("ready", False, "q2", None),
            ("ready", True, None, None),  # --state scheduled
            ("ready", True, "q3", None),
            ("succeeded", False, None, None),
        ]
    ],
    "job_get": [{"id": 1234}],
    "job_retry_many": [
        {"ids": list(range(50, 550)), "by": "op@host", "scratch": scratch}
        for scratch in (False, True)  # --from-scratch clears the checkpoints too
    ],
    "job_dead_ids": [
        {"after": 0, "queue": None, "task": None},
        {"after": 0, "queue": "q1", "task": "t3"},
    ],
    "job_cancel_many": [{"ids": list(range(FINISHED, FINISHED + 500)), "by": "op@host"}],
    "job_purge_cutoff": [{"older": 7 * 86400.0}],
    "job_purge_count": [
        {"state": "succeeded", "cap": 1_000_000},
        {"state": "dead", "cap": 1_000_000},
    ],
    "job_purge_batch": [{"state": "succeeded"}, {"state": "dead"}],
    "job_dead_recent": [{"limit": 5}],
    "job_finished_per_minute": [{"minutes": 60}],
    "batch_list_open": [{"limit": 20}],
    "batch_list_finished": [{"limit": 20}],
    "batch_callback": [{"id": 1}],
    "batch_tally_many": [{"ids": [1, 2, 3]}],
}
PARAMS["job_list_window"] = PARAMS["job_list"]
for p in PARAMS["job_list"]:
    p.update(window=50_000, limit=51)
for p in PARAMS["job_purge_count"] + PARAMS["job_purge_batch"] + PARAMS["job_dead_ids"]:
    p.update(cutoff=None, limit=500)


def fill(
    db: psycopg.Connection[Any],
    schema: str,
    finished: int,
    progress: Callable[[int], None] = lambda done: None,
) -> None:
    """`finished` jobs completed over the last day (2% dead, 1% cancelled), 2,000 ready (a
    quarter delayed), 100 running, in 4 queues; then VACUUM ANALYZE, as autovacuum would.

    The finished rows go in by a million per statement, `progress` told after each.
    """
    for lo in range(1, finished + 1, CHUNK):
        db.execute(
            f"""INSERT INTO {schema}.jobs
                (queue, task, state, attempts, created_at, started_at, completed_at, last_error)
            SELECT 'q' || (i %% 4), 't' || (i %% 7), s.state::{schema}.job_state, 1,
                   c - interval '2 seconds', c - interval '1 second', c,
                   CASE WHEN s.state = 'dead' THEN 'boom ' || i END
            FROM generate_series(%(lo)s::integer, %(hi)s::integer) AS i,
            LATERAL (SELECT now() - make_interval(secs => (%(n)s - i) * 86400.0 / %(n)s) AS c,
                     CASE WHEN i %% 50 = 0 THEN 'dead' WHEN i %% 100 = 1 THEN 'cancelled'
                          ELSE 'succeeded' END AS state) AS s""",
            {"lo": lo, "hi": min(lo + CHUNK - 1, finished), "n": finished},
        )
        progress(min(lo + CHUNK - 1, finished))
    db.execute(
        f"""INSERT INTO {schema}.jobs (queue, task, available_at)
        SELECT 'q' || (i % 4), 't' || (i % 7),
               now() + make_interval(secs => CASE WHEN i % 4 = 0 THEN 600 ELSE -i END)
        FROM generate_series(1, 2000) AS i"""
    )
    db.execute(
        f"""INSERT INTO {schema}.jobs
            (queue, task, state, attempts, lease_owner, lease_until, started_at)
        SELECT 'q' || (i % 4), 't' || (i % 7), 'running', 1, 'host:' || i || ':w',
               now() + interval '30 seconds', now() - make_interval(secs => i)
        FROM generate_series(1, 100) AS i"""
    )
    db.execute(f"VACUUM ANALYZE {schema}.jobs")


def with_cutoff(params: dict[str, Any], cutoff: datetime) -> dict[str, Any]:
    """`params` with the purge cutoff (a time the database gives) filled in."""
    return {k: cutoff if k == "cutoff" else v for k, v in params.items()}


def seq_scans(plan: dict[str, Any]) -> Iterator[str]:
    """The relations a plan (EXPLAIN FORMAT JSON's node) reads by sequential scan."""
    if plan.get("Node Type") == "Seq Scan":
        yield str(plan.get("Relation Name"))
    for child in plan.get("Plans", []):
        yield from seq_scans(child)


def explain(db: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> dict[str, Any]:
    row = db.execute("EXPLAIN (FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    plan: dict[str, Any] = row[0][0]["Plan"]
    return plan


@pytest.fixture
def filled(db: psycopg.Connection[Any], schema: str) -> str:
    fill(db, schema, FINISHED)
    return schema


# The batch store's queries that an operator runs or that read a batch's jobs (the rest
# write, or read one row).
BATCH_READS: dict[str, list[dict[str, Any]]] = {
    "batch_done_among": [{"ids": [1, 2, 3]}],
    "batch_counts": [{"id": 1}],
    "batch_job_ids": [{"id": 1, "after": 0, "limit": 5000}],
    "batch_results": [{"id": 1, "after": 0, "limit": 5000}],
    "batch_dead": [{"id": 1, "after": 0, "limit": 5000}],
    "batch_open_jobs": [{"id": 1, "after": 0, "limit": 5000}],
    "batch_finish": [{"id": 1}],
    "job_cancel_many": PARAMS["job_cancel_many"],
    "batch_list_open": PARAMS["batch_list_open"],
    "batch_list_finished": PARAMS["batch_list_finished"],
    "batch_callback": PARAMS["batch_callback"],
    "batch_tally_many": PARAMS["batch_tally_many"],
}


@pytest.mark.parametrize(
    ("package", "file"),
    [
        ("forklift.admin", "queries.sql"),
        ("forklift.admin", "jobs.sql"),
        ("forklift.store", "batches.sql"),
    ],
)
def test_no_operator_query_scans_the_jobs_table(
    db: psycopg.Connection[Any], filled: str, package: str, file: str
) -> None:
    queries = _sql.load(package, file, filled)
    if package == "forklift.store":
        queries = {name: sql for name, sql in queries.items() if name in BATCH_READS}
        PARAMS.update(BATCH_READS)
    cutoff = db.execute("SELECT now() - interval '7 days'").fetchone()
    assert cutoff is not None
    scanned = {}
    for name, sql in queries.items():
        for params in PARAMS.get(name, [{}]):
            params = with_cutoff(params, cutoff[0])
            plan = explain(db, sql, params)
            if "jobs" in set(seq_scans(plan)):
                scanned[name] = params
    assert scanned == {}, f"sequential scans of the jobs table: {scanned}"


def test_a_claim_reconciliation_reads_only_its_owners_running_jobs(
    db: psycopg.Connection[Any], filled: str
) -> None:
    """job_release_unknown, after a claim whose answer was lost, looks at the jobs the
    worker holds by the running index, whatever the table holds besides."""
    sql = _sql.load("forklift.store", "queries.sql", filled)["job_release_unknown"]
    plan = explain(db, sql, {"owner": "me", "known": [1, 2, 3]})
    assert "jobs" not in set(seq_scans(plan)), json.dumps(plan, indent=1)


def test_claims_under_limits_read_the_jobs_table_through_its_indexes(
    db: psycopg.Connection[Any], filled: str
) -> None:
    """The claim under limits (after its lock statement, in one transaction), the wake-up
    lookup and the producer's read: no sequential scan of the jobs table, with a day of
    finished jobs in it."""
    db.execute(
        f"INSERT INTO {filled}.limits (scope, name, concurrency, keyed, key_arg)"
        " VALUES ('task', 't1', 1, true, 'k'), ('task', 't2', 3, false, NULL)"
    )
    db.execute(
        f"INSERT INTO {filled}.limits (scope, name, rate, per, max_depth)"
        " VALUES ('queue', 'q1', 10, 1.0, 1000)"
    )
    queries = _sql.load("forklift.store", "limits.sql", filled)
    params = {
        "queues": ["q0", "q1", "q2"], "tasks": ["t1", "t2", "t3"], "owner": "host:1:w",
        "limit": 64, "lease": 30.0, "expired": True, "queue": "q1", "upto": 1000,
        "shared": False, "lanes": 4, "lane_claim": 256, "visit": 64, "keys": 32, "rekey": 256,
        "after_queues": ["q0"], "after_tasks": ["t1"], "after_keys": ["k"], "since": 0.01,
        "names": ["t1", "t3"], "stale": 600.0, "ids": [5, 6], "attempts": [1, 1], "id": 5,
        "attempt": 1, "labels": [],
    }  # fmt: skip
    scanned = []
    with db.transaction():
        db.execute(queries["limit_lock"], params)
        for name in (
            "limits_apply",
            "job_claim_limited",
            "job_claim_shared",
            "limit_wake",
            "producer_limits",
            "queue_depth",
            "limit_unregister",
            "job_stopping_renew",
            "job_stopping_let_go",
        ):
            if "jobs" in set(seq_scans(explain(db, queries[name], params))):
                scanned.append(name)
    assert scanned == []


def test_plain_claims_read_the_jobs_table_through_its_indexes(
    db: psycopg.Connection[Any], filled: str
) -> None:
    """A worker's claims without limits (the usual one-queue claim and the general one,
    with and without the expiry scan): no sequential scan of the jobs table, with a day of
    finished jobs in it."""
    queries = _sql.load("forklift.store", "queries.sql", filled)
    params = {"queue": "q1", "queues": ["q1"], "owner": "host:1:w", "lease": 30.0, "alone": True,
              "floor": None, "labels": ["gpu"], "sets": ["gpu"]}  # fmt: skip
    scanned = []
    for name, queues, expired in [
        ("job_claim_one", ["q1"], False),
        ("job_claim", ["q1"], True),
        ("job_claim", ["q0", "q1", "q2"], False),
        ("job_claim_labelled", ["q1"], True),
        ("job_claim_labelled", ["q0", "q1", "q2"], False),
    ]:
        for limit in (1, 128):
            params.update(queues=queues, expired=expired, limit=limit)
            if "jobs" in set(seq_scans(explain(db, queries[name], params))):
                scanned.append((name, queues, expired, limit))
    assert scanned == []


# The writes over a worker's leases, with what each takes besides ids, attempts, owner
# ("ids": the leases' ids again).
FENCED: dict[str, dict[str, Any]] = {
    "lease_renew_many": {"lease": 30.0, "seen": "ids"},
    "job_complete_many": {},
    "job_complete_many_values": {"results": "result", "progress": "progress"},
    "job_progress_many": {"progress": "progress"},
    "job_release_many": {},
    "job_cancelled_among": {},  # reads (which of them an operator cancelled)
    "job_succeeded_among": {},  # reads (which completions whose answer was lost committed)
}
LEASES = 500


def rows_walked(plan: dict[str, Any]) -> int:
    """Rows every node of an EXPLAIN ANALYZE plan produced, over all its loops."""
    own = int(plan.get("Actual Rows", 0)) * int(plan.get("Actual Loops", 1))
    return own + sum(rows_walked(child) for child in plan.get("Plans", []))


def as_prepared(sql: str) -> tuple[str, list[str]]:
    """`sql` with its %(name)s parameters numbered $1, $2, ... (first use order), for
    PREPARE; and the names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match[1] not in names:
            names.append(match[1])
        return f"${names.index(match[1]) + 1}"

    return re.sub(r"%\((\w+)\)s", number, sql), names


@pytest.mark.parametrize("name", sorted(FENCED))
def test_a_write_over_many_leases_looks_each_up_once_in_a_generic_plan(
    db: psycopg.Connection[Any], schema: str, name: str
) -> None:
    """Planned generically, as a statement psycopg prepares after five runs is, a join
    of 128 completions with the worker's running jobs put the unnested leases inside a
    nested loop: 16,384 rows walked, 128 x 128. Each lease must be looked up once:
    the rows walked (by every node of the plan) grow with the leases, not with their
    square."""
    # Analyzed while they were ready, as a table mostly is: the statistics know of no
    # running job and no owner, which is what made the join's plan go quadratic.
    db.execute(
        f"INSERT INTO {schema}.jobs (queue, task) SELECT 'q', 't' FROM generate_series(1, %s)",
        (2 * LEASES,),
    )
    db.execute(f"ANALYZE {schema}.jobs")
    db.execute(
        f"""UPDATE {schema}.jobs SET state = 'running', attempts = 1,
            lease_owner = CASE WHEN id % 2 = 0 THEN 'me' ELSE 'other' END,
            lease_until = now() + interval '30 seconds', started_at = now()"""
    )
    ids = [r[0] for r in db.execute(f"SELECT id FROM {schema}.jobs WHERE lease_owner = 'me'")]
    assert len(ids) == LEASES
    sql, names = as_prepared(_sql.load("forklift.store", "queries.sql", schema)[name])
    values: dict[str, Any] = {"ids": sorted(ids), "attempts": [1] * LEASES, "owner": "me"}
    for param, kind in FENCED[name].items():
        if kind in ("result", "progress"):
            values[param] = [f'{{"{kind}": 1}}'] * LEASES
        else:
            values[param] = sorted(ids) if kind == "ids" else kind
    with db.transaction(force_rollback=True):
        db.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        db.execute(f"PREPARE fenced AS {sql}")
        try:
            types = db.execute(
                "SELECT parameter_types::text[] FROM pg_prepared_statements WHERE name = 'fenced'"
            ).fetchone()
            assert types is not None
            # EXECUTE's arguments are not bound parameters: literals, cast to the types.
            args = psycopg.sql.SQL(", ").join(
                psycopg.sql.SQL("{}::{}").format(psycopg.sql.Literal(values[n]), psycopg.sql.SQL(t))
                for n, t in zip(names, types[0], strict=True)
            )
            explain = psycopg.sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE fenced({})")
            row = db.execute(explain.format(args)).fetchone()
        finally:
            db.execute("DEALLOCATE fenced")
    assert row is not None
    plan = row[0][0]["Plan"]
    assert rows_walked(plan) <= 40 * LEASES, json.dumps(plan, indent=1)  # not LEASES²


# -- bounded whatever other queues hold ----------------------------------------------

ELSEWHERE = 1_000_000  # jobs of another queue


def fill_elsewhere(db: psycopg.Connection[Any], schema: str) -> None:
    """`ELSEWHERE` jobs in queue `other`, due before anything of q1's: 40% ready and due,
    20% ready and due under a limit's key (held back), 20% ready and due later, 10% dead,
    10% succeeded; and a few of each kind in q1 (the queue asked about). Then VACUUM
    ANALYZE, as autovacuum would."""
    db.execute(
        f"""INSERT INTO {schema}.jobs
            (queue, task, state, attempts, limit_key, available_at, completed_at)
        SELECT 'other', 't' || (i %% 7), k.state::{schema}.job_state,
               CASE WHEN k.state = 'ready' THEN 0 ELSE 1 END,
               CASE WHEN i %% 10 IN (4, 5) THEN 'k' || (i %% 3) END,
               now() + make_interval(secs => CASE WHEN i %% 10 IN (6, 7) THEN 600 + i
                                                  ELSE -3600 - i END),
               CASE WHEN k.state <> 'ready' THEN now() - make_interval(secs => i) END
        FROM generate_series(1, %(n)s::integer) AS i,
        LATERAL (SELECT CASE WHEN i %% 10 = 8 THEN 'dead' WHEN i %% 10 = 9 THEN 'succeeded'
                             ELSE 'ready' END AS state) AS k""",
        {"n": ELSEWHERE},
    )
    db.execute(
        f"""INSERT INTO {schema}.jobs (queue, task, limit_key, available_at)
        SELECT 'q1', 't' || (i % 7), CASE WHEN i % 3 = 0 THEN 'k' END,
               now() + make_interval(secs => CASE WHEN i % 4 = 0 THEN 60 ELSE -i END)
        FROM generate_series(1, 20) AS i"""
    )
    db.execute(f"VACUUM ANALYZE {schema}.jobs")


def rows_read(plan: dict[str, Any]) -> int:
    """Rows every node of an EXPLAIN ANALYZE plan produced or read and threw away (by a
    filter), over all its loops: what a statement walked."""
    loops = int(plan.get("Actual Loops", 1))
    own = sum(
        int(plan.get(k, 0))
        for k in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
    )
    return own * loops + sum(rows_read(child) for child in plan.get("Plans", []))


def walked(db: psycopg.Connection[Any], sql: str, params: dict[str, Any]) -> int:
    """Rows `sql` walks when run (in a transaction rolled back: claims write)."""
    with db.transaction(force_rollback=True):
        row = db.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params).fetchone()
    assert row is not None
    return rows_read(row[0][0]["Plan"])


BOUND = 2_000  # rows a hot statement may walk here: q1's few, a claim's limit, no more


def test_hot_statements_are_bounded_by_an_index_whatever_other_queues_hold(
    db: psycopg.Connection[Any], schema: str
) -> None:
    """A worker's claims and its idle lookups (with and without limits), the producer's
    depth check and the autoscaler's backlog, on a queue with a few jobs beside a million
    of another queue (due sooner, held back under a limit, delayed, finished): each walks
    a few rows, not the other queue's. The next-due lookups walked every ready job of
    every queue due sooner (50 ms an idle wait at 300,000)."""
    fill_elsewhere(db, schema)
    db.execute(
        f"INSERT INTO {schema}.limits (scope, name, concurrency, keyed, key_arg)"
        " VALUES ('task', 't1', 1, true, 'k'), ('task', 't2', 3, false, NULL)"
    )
    store = _sql.load("forklift.store", "queries.sql", schema)
    limits = _sql.load("forklift.store", "limits.sql", schema)
    supervisor = _sql.load("forklift.supervisor", "queries.sql", schema)
    params = {
        "queue": "q1", "queues": ["q1"], "tasks": ["t1", "t2", "t3"], "owner": "host:1:w",
        "limit": 128, "lease": 30.0, "expired": False, "alone": True, "since": 0.01,
        "upto": 1000, "cap": 10_000, "shared": False, "lanes": 4, "lane_claim": 256,
        "visit": 64, "keys": 32, "rekey": 256, "after_queues": ["q1"], "after_tasks": ["t1"],
        "after_keys": ["k"], "floor": None, "labels": [],
    }  # fmt: skip
    statements: list[tuple[str, str, dict[str, Any]]] = [
        ("job_claim_one", store["job_claim_one"], {}),
        ("job_claim_one limit 1", store["job_claim_one"], {"limit": 1}),
        ("job_claim one queue, expired", store["job_claim"], {"expired": True}),
        ("job_claim two queues", store["job_claim"], {"queues": ["q1", "q2"]}),
        ("job_next_available", store["job_next_available"], {}),
        ("limits_apply", limits["limits_apply"], {}),
        ("limit_wake", limits["limit_wake"], {}),
        ("queue_depth (producer)", limits["queue_depth"], {}),
        ("job_backlog", supervisor["job_backlog"], {}),
    ]
    read = {name: walked(db, sql, {**params, **extra}) for name, sql, extra in statements}
    with db.transaction(force_rollback=True):
        db.execute(limits["limit_lock"], params)
        for name in ("job_claim_limited", "job_claim_shared"):
            read[name] = walked(db, limits[name], params)
    assert {name: n for name, n in read.items() if n > BOUND} == {}


def test_queue_depth_reads_a_capped_count_whatever_the_queues_hold(
    db: psycopg.Connection[Any], schema: str
) -> None:
    """The queue gauges (every second, per replica and per dashboard tab) counted every
    ready, running and dead job of every queue: with a million in another queue, they
    read that million each time. Counted up to the cap, they read a few times the cap,
    and say exactly what a queue under the cap holds."""
    fill_elsewhere(db, schema)
    cap = 1_000
    sql = _sql.load("forklift.admin", "queries.sql", schema)["queue_depth"]
    assert walked(db, sql, {"cap": cap}) <= 10 * cap + BOUND  # (rows each node produced)
    rows = {r[0]: r[1:5] for r in db.execute(sql, {"cap": cap})}
    assert rows["other"] == (cap, cap, 0, cap)  # each: `cap` or more
    assert rows["q1"] == (15, 5, 0, 0)  # exact, under the cap
