"""The dashboard's server time on a million retained jobs: every page ≤ 100 ms p99, the
live refresh ≤ 20 ms p99.

    python -m bench.dashboard [--rows 1_000_000] [--requests 200]

Fills a fresh schema with `--rows` jobs (tests/integration/test_query_plans.py's `fill`:
finished over the last day, 2% dead and 1% cancelled, plus 2,000 ready and 100 running,
inserted by generate_series), puts a fifth of the finished jobs and 10,000 ready ones in
batches (one of them open), registers 3 hosts of 1 supervisor and 8 workers and 10
schedules, then VACUUM ANALYZEs as autovacuum would. Then `forklift dashboard` runs as
its own process and each page is requested `--requests` times in a row over one
keep-alive connection, after a few untimed ones. Its server time is what the dashboard
itself says (the `Server-Timing` header: from the request's arrival in Flask to the
answer, database included); the wall time on the client (loopback HTTP included) is
shown beside it. Pages are what a click loads; live parts what an open page fetches each
second (the charts' part every ten seconds, timed as a page).
"""

from __future__ import annotations

import http.client
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

if not __package__:  # run as `python bench/dashboard.py`: put the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._harness import Bench, Row, parser, percentile, positive, print_table, say
from forklift.testing import wait_for
from tests.integration.test_query_plans import fill

PAGE_TARGET = 100.0  # ms, p99 of a page's server time
LIVE_TARGET = 20.0  # ms, p99 of a live refresh's server time
WARMUP = 5
HOSTS, WORKERS = 3, 8
_URL = re.compile(r"forklift dashboard: (http://\S+/) ")
_TIMING = re.compile(r"app;dur=([\d.]+)")


@dataclass(frozen=True)
class Timed:
    server: list[float]  # ms, as the dashboard reports it
    wall: list[float]  # ms, on the client


def extras(bench: Bench) -> dict[str, int]:
    """Batches, processes and schedules beside the jobs; the ids the pages show."""
    s, db = bench.schema, bench.db
    found = db.execute(
        f"INSERT INTO {s}.batches (total, sealed_at, callback, created_at) VALUES (210000,"
        " now() - interval '1 day', %s, now() - interval '1 day') RETURNING id",
        ('{"task": "assemble", "queue": "q0", "args": {}}',),
    ).fetchone()
    assert found is not None
    big = found[0]
    db.execute(
        f"UPDATE {s}.jobs SET batch_id = %s WHERE id IN (SELECT id FROM {s}.jobs"
        " WHERE state IN ('succeeded', 'dead', 'cancelled') ORDER BY id DESC LIMIT 200000)",
        (big,),
    )
    db.execute(
        f"INSERT INTO {s}.jobs (queue, task, batch_id, available_at)"
        " SELECT 'q' || (i %% 4), 'tile', %s, now() - interval '1 minute'"
        " FROM generate_series(1, 10000) AS i",
        (big,),
    )
    for i in range(20):  # finished batches, as `batches list` shows them
        db.execute(
            f"INSERT INTO {s}.batches (total, sealed_at, finished_at, outcome) VALUES"
            f" (100, now() - interval '{i + 2} hours', now() - interval '{i + 1} hours',"
            " 'succeeded')"
        )
    for h in range(HOSTS):
        sup = f"host{h}:100:s"
        rows = [(sup, "supervisor", None)] + [
            (f"host{h}:{101 + w}:w@100.s", "worker", sup) for w in range(WORKERS)
        ]
        for id_, kind, parent in rows:
            db.execute(
                f"INSERT INTO {s}.processes (id, kind, host, pid, supervisor_id, queues)"
                " VALUES (%s, %s, %s, 1, %s, '{q0,q1,q2,q3}')",
                (id_, kind, f"host{h}", parent),
            )
    for n in range(10):
        db.execute(
            f"INSERT INTO {s}.schedules (name, task, queue, every_seconds, tz, overlap,"
            " definition_hash, defined_at, fired_through) VALUES (%s, 't', 'q0', 60, 'UTC',"
            " false, 'h', now(), now())",
            (f"sched{n}",),
        )
    db.execute(f"VACUUM ANALYZE {s}.jobs")
    dead = bench.scalar(f"SELECT max(id) FROM {s}.jobs WHERE state = 'dead'")
    middle = bench.scalar(f"SELECT max(id) / 2 FROM {s}.jobs")
    return {"batch": int(big), "dead": int(dead), "middle": int(middle)}


def timed(conn: http.client.HTTPConnection, path: str, requests: int) -> Timed:
    server, wall = [], []
    for n in range(WARMUP + requests):
        start = time.perf_counter()
        conn.request("GET", path)
        answer = conn.getresponse()
        answer.read()
        took = (time.perf_counter() - start) * 1000
        if answer.status != 200:
            raise RuntimeError(f"{path}: {answer.status}")
        if n >= WARMUP:
            found = _TIMING.search(answer.getheader("Server-Timing") or "")
            assert found is not None, "no Server-Timing header"
            server.append(float(found[1]))
            wall.append(took)
    return Timed(server, wall)


def row(name: str, t: Timed, target: float) -> Row:
    p99 = percentile(t.server, 99)
    value = (
        f"p50 {percentile(t.server, 50):5.1f}  p99 {p99:5.1f}  max {max(t.server):5.1f} ms"
        f"  (wall p99 {percentile(t.wall, 99):5.1f})"
    )
    return Row(name, value, f"p99 <= {target:.0f} ms", p99 <= target)


def main(argv: list[str] | None = None) -> int:
    p = parser("python -m bench.dashboard", __doc__)
    p.add_argument("--rows", type=positive, default=1_000_000, help="finished jobs retained")
    p.add_argument("--requests", type=positive, default=200, help="timed requests per page")
    args = p.parse_args(argv)
    with Bench(args.dsn, lambda app: app, "dashboard").session() as bench:
        start = time.monotonic()
        fill(bench.db, bench.schema, args.rows, lambda done: say(f"  {done:,} rows in"))
        ids = extras(bench)
        total = bench.scalar(f"SELECT count(*) FROM {bench.schema}.jobs")
        say(f"setup: {total:,} jobs in {time.monotonic() - start:.0f} s; starting the dashboard")
        proc = bench.start("dashboard", "--bind", "127.0.0.1:0")
        url = wait_for(lambda: _URL.search(proc.output()), timeout=30, what="the dashboard")[1]
        where = urlsplit(url)
        conn = http.client.HTTPConnection(where.hostname or "127.0.0.1", where.port, timeout=30)
        b, dead, middle = ids["batch"], ids["dead"], ids["middle"]
        pages = {
            "/ (overview)": "/", "/jobs": "/jobs", "/jobs?state=dead": "/jobs?state=dead",
            "/jobs?queue=q1": "/jobs?queue=q1",
            "/jobs?task=t3&error=boom 1": "/jobs?task=t3&error=boom+1",
            "/jobs?state=succeeded&before=(middle)": f"/jobs?state=succeeded&before={middle}",
            "/jobs?state=scheduled": "/jobs?state=scheduled", "/jobs/(dead job)": f"/jobs/{dead}",
            "/batches": "/batches", "/batches/(200,000 jobs)": f"/batches/{b}",
            "/schedules": "/schedules", "/processes": "/processes", "/live/charts": "/live/charts",
        }  # fmt: skip
        live = {
            "/live/ (overview)": "/live/", "/live/jobs": "/live/jobs",
            "/live/jobs?state=dead": "/live/jobs?state=dead",
            "/live/jobs/(dead job)": f"/live/jobs/{dead}", "/live/batches": "/live/batches",
            "/live/batches/(200,000 jobs)": f"/live/batches/{b}",
            "/live/processes": "/live/processes", "/live/schedules": "/live/schedules",
        }  # fmt: skip
        rows = []
        for target, group in ((PAGE_TARGET, pages), (LIVE_TARGET, live)):
            for name, path in group.items():
                say(f"  {name}")
                rows.append(row(name, timed(conn, path, args.requests), target))
        conn.close()
        rows.append(Row("jobs retained", f"{total:,}"))
        print_table(rows, f"dashboard server time, {total:,} jobs, {args.requests} requests each")
    return 0 if all(r.met is not False for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
