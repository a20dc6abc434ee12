"""Limits hold exactly under faults: three supervisors claim at once from one schema while
workers are SIGKILLed again and again, one supervisor's whole group is killed, and the
database restarts; never more of a key (or of a queue with a limit of its own) running
than its concurrency, never more starts in a second than the rate, not even briefly. And
a key's backlog does not hold up another's.

What counts as a run (the checks read `{schema}.runs`, written by tests/apps/limited.py):

- It starts at its claim (`jobs.started_at` of its attempt: the limited claim's clock,
  read under the limit lock) and ends when its handler wrote its end. A run killed
  mid-way (or whose end the database was not there to take) ends when its attempt was
  charged (the `at` of its entry in `jobs.errors`: a supervisor's charge of a dead
  worker, or the claim that took over an expired lease) or its job finished on that
  attempt (`completed_at`). That is after the run really stopped (a charge comes after
  the death) and no later than any claim could see its slot free (it is the charging
  transaction's own start), so every interval lies within the time the claim counts
  the job as running: an overlap found is one the claim let happen, never one the
  bookkeeping made up. Ending a killed run at its job's next start or at the test's end
  instead would make overlaps up (other jobs of the key rightly run in between).
- Rates are counted on the claim's clock, not the handler's: `jobs.started_at` is the
  time the claim admitted the start, in the order the limit lock serialised them; a
  handler's own clock reading comes after the claim, late by however long its worker
  took to start it (a claim ahead, a busy thread), and would spread or bunch starts
  that the claim counted in one window.
- A run whose worker died before it wrote its start is not seen (it did nothing but be
  claimed): it can hide an overlap or a start, never invent one. Every succeeded
  attempt is seen (a handler that cannot write its start fails), and a run killed
  after its start counts until its charge, the window where the faults matter most.
"""

from __future__ import annotations

import bisect
import dataclasses
import datetime as dt
import random
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

import forklift
from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.acceptance.proxy import Proxy
from tests.apps.limited import ATTEMPTS, CRASHES, RUNS
from tests.faults.harness import Fleet, Workload
from tests.faults.injector import Fault, Injector

APP = "tests.apps.limited:app"
KEYS = [f"k{i}" for i in range(10)]
PER_KEY, GLOBAL4, RATED = 600, 200, 200
RATE, PER = 20, 1.0
QUEUE = 9  # a limit on queue "default" (not rated's queue): below the fleet's 12 slots


@dataclass(frozen=True)
class Run:
    job_id: int
    attempt: int
    task: str
    key: str
    pid: int
    start: dt.datetime  # its claim
    end: dt.datetime
    how: str  # what ended it: "ended" (its handler), "charged" or "finished" (its job)

    def __str__(self) -> str:
        return (
            f"job {self.job_id} attempt {self.attempt} (worker pid {self.pid}):"
            f" {self.start.time()} .. {self.end.time()} {self.how}"
        )


@dataclass(frozen=True)
class Peak:
    """The most runs of one group at once, and the runs at that moment."""

    group: tuple[str, str]
    n: int
    runs: list[Run]


def runs_of(db: psycopg.Connection[Any], schema: str) -> list[Run]:
    """Every recorded run, ended as the module docstring says."""
    jobs = {
        r[0]: r[1:]
        for r in db.execute(
            f"SELECT id, state::text, attempts, completed_at, errors FROM {schema}.jobs"
        )
    }
    rows = db.execute(
        f"SELECT job_id, attempt, task, key, pid, claimed, ended FROM {schema}.runs"
    ).fetchall()
    runs = []
    for job_id, attempt, task, key, pid, claimed, ended in rows:
        assert claimed is not None, f"job {job_id} attempt {attempt} ran without its claim"
        if ended is not None:
            runs.append(Run(job_id, attempt, task, key, pid, claimed, ended, "ended"))
            continue
        state, attempts, completed_at, errors = jobs[job_id]
        ends = [
            (at, "charged")
            for at in (
                dt.datetime.fromisoformat(e["at"]) for e in errors if e["attempt"] == attempt
            )
            if at >= claimed
        ]
        if state in ("succeeded", "dead") and attempts == attempt:
            ends.append((completed_at, "finished"))
        assert ends, f"job {job_id} attempt {attempt}: a run neither charged nor finished"
        end, how = min(ends)
        runs.append(Run(job_id, attempt, task, key, pid, claimed, end, how))
    return runs


def peaks(runs: Sequence[Run]) -> dict[tuple[str, str], Peak]:
    """Per (task, key): the most runs at once, intervals half-open (a run that ends as
    another starts, as a charge and the re-claim in one transaction, is not an overlap)."""
    by_group: dict[tuple[str, str], list[Run]] = defaultdict(list)
    for run in runs:
        by_group[(run.task, run.key)].append(run)
    found = {}
    for group, members in by_group.items():
        # Ends before starts at the same instant.
        events = sorted(
            [(r.start, 1, i) for i, r in enumerate(members)]
            + [(r.end, 0, i) for i, r in enumerate(members)]
        )
        open_now: set[int] = set()
        best = Peak(group, 0, [])
        for _, starts, i in events:
            if starts:
                open_now.add(i)
                if len(open_now) > best.n:
                    best = Peak(group, len(open_now), [members[j] for j in sorted(open_now)])
            else:
                open_now.discard(i)
        found[group] = best
    return found


def busiest_window(starts: Sequence[dt.datetime], per: float) -> tuple[int, list[dt.datetime]]:
    """The most starts in any window [t, t + per) and those starts."""
    ordered = sorted(starts)
    best: tuple[int, list[dt.datetime]] = (0, [])
    width = dt.timedelta(seconds=per)
    for i, t in enumerate(ordered):
        j = bisect.bisect_left(ordered, t + width)
        if j - i > best[0]:
            best = (j - i, ordered[i:j])
    return best


def limited_fleet(workload: Workload, tmp_path: Path, proxy: Proxy, args: Sequence[str]) -> Fleet:
    return Fleet.for_workload(workload, tmp_path, args, proxy.dsn_through(workload.dsn), app=APP)


@pytest.fixture
def runs_table(workload: Workload) -> Workload:
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(RUNS.format(schema=workload.schema))
    return workload


@pytest.fixture
def fleet3(runs_table: Workload, tmp_path: Path, proxy: Proxy) -> Iterator[Fleet]:
    fleet = limited_fleet(
        runs_table, tmp_path, proxy,
        ["--workers", "2", "--concurrency", "2", "--queues", "default,rated", "--lease", "3s",
         "--grace", "5s"],
    )  # fmt: skip
    yield fleet
    fleet.kill()


def spec(task: str, **args: Any) -> forklift.JobSpec:
    queue = "rated" if task == "rated" else "default"
    return forklift.JobSpec(task, args, queue=queue, max_attempts=ATTEMPTS, max_crashes=CRASHES)


def enqueue_mix(workload: Workload) -> None:
    """The three tasks' jobs interleaved in line, so that all three are claimed together."""
    specs = [spec("per_key", k=KEYS[i % len(KEYS)], n=i) for i in range(PER_KEY)]
    specs += [spec("global4", n=i) for i in range(GLOBAL4)]
    specs += [spec("rated", n=i) for i in range(RATED)]
    random.Random(7).shuffle(specs)
    workload.app.enqueue_many(specs)


def drain_under_faults(workload: Workload, fleet: Fleet, injector: Injector) -> list[str]:
    """SIGKILL a worker every ~0.4 s while the jobs drain; at 80% of them left, one
    supervisor's whole group (a fresh one started in its place); at 55%, a database
    restart; no more kills from 15% left. The faults done."""
    total = PER_KEY + GLOBAL4 + RATED
    done: list[str] = []
    group_killed = restarted = False
    deadline = time.monotonic() + 120
    while (left := workload.unfinished()) is None or left > total * 0.15:
        assert time.monotonic() < deadline, f"not drained in 120 s: {left} left; {done}"
        if left is not None and not group_killed and left < total * 0.8:
            injection = injector.inject(Fault.KILL_GROUP)
            group_killed = True
        elif left is not None and group_killed and not restarted and left < total * 0.55:
            injection = injector.inject(Fault.DB_RESTART)
            restarted = True
        else:
            injection = injector.inject(Fault.KILL_WORKER)
        done.append(f"{injection.fault} {injection.detail}".strip())
        time.sleep(0.4)
    assert group_killed and restarted, done
    return done


@pytest.mark.timeout(240)
def test_limits_hold_across_three_supervisors_under_kills_and_a_database_restart(
    cluster: Cluster, proxy: Proxy, runs_table: Workload, fleet3: Fleet
) -> None:
    workload = runs_table
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(
            f"INSERT INTO {workload.schema}.limits (scope, name, concurrency)"
            " VALUES ('queue', 'default', %s)",
            (QUEUE,),
        )
    enqueue_mix(workload)
    injector = Injector(cluster, proxy, fleet3, workload, lease=3.0)
    fleet3.start(3)
    fleet3.wait_ready()
    faults = drain_under_faults(workload, fleet3, injector)
    kills = sum(1 for f in faults if f.startswith(Fault.KILL_WORKER))
    assert kills >= 8, faults
    workload.wait_finished(timeout=120, check=fleet3.procs)

    with psycopg.connect(workload.dsn, autocommit=True) as db:
        runs = runs_of(db, workload.schema)
        jobs = db.execute(
            f"SELECT id, task, state::text, attempts, last_error FROM {workload.schema}.jobs"
        ).fetchall()
    found = peaks(runs)
    per_key = max((p for g, p in found.items() if g[0] == "per_key"), key=lambda p: p.n)
    global4 = found[("global4", "")]
    in_default = [dataclasses.replace(r, task="default", key="") for r in runs if r.task != "rated"]
    queue = peaks(in_default)[("default", "")]
    window, in_window = busiest_window([r.start for r in runs if r.task == "rated"], PER)
    ends = Counter(r.how for r in runs)
    measured = (
        f"max per_key overlap {per_key.n} (key {per_key.group[1]}), max global4 overlap"
        f" {global4.n}, max queue-wide overlap {queue.n}, max rated starts in {PER:g} s"
        f" {window}; {len(runs)} runs ended by {dict(ends)}; faults: {len(faults)}"
        f" ({kills} worker kills)"
    )
    print(measured)

    def witness(peak: Peak) -> str:
        return "\n".join(str(r) for r in peak.runs)

    assert per_key.n <= 1, f"{measured}\n{witness(per_key)}\n{fleet3.output()[-3000:]}"
    assert global4.n <= 4, f"{measured}\n{witness(global4)}\n{fleet3.output()[-3000:]}"
    assert queue.n <= QUEUE, f"{measured}\n{witness(queue)}\n{fleet3.output()[-3000:]}"
    assert window <= RATE, f"{measured}\nstarts: {[t.time() for t in in_window]}"
    # The limits were reached (a check of runs that never met their limit proves nothing).
    assert (per_key.n, global4.n, queue.n, window) == (1, 4, QUEUE, RATE), measured

    # Nothing lost: every job ended, a dead one saying why; a succeeded one's last
    # attempt is among the recorded runs (the record is whole where it counts).
    assert len(jobs) == PER_KEY + GLOBAL4 + RATED
    lost = [j for j in jobs if j[2] not in ("succeeded", "dead") or (j[2] == "dead" and not j[4])]
    assert lost == [], lost[:10]
    recorded = {(r.job_id, r.attempt) for r in runs}
    unseen = [j[0] for j in jobs if j[2] == "succeeded" and (j[0], j[3]) not in recorded]
    assert unseen == [], unseen[:10]
    # With 20 attempts and 10 crashes to spare each, none runs out.
    assert [j for j in jobs if j[2] == "dead"] == []


@pytest.mark.timeout(120)
def test_a_key_with_ten_thousand_jobs_ahead_does_not_hold_up_another_key(
    runs_table: Workload, tmp_path: Path, proxy: Proxy
) -> None:
    workload = runs_table
    specs = [spec("per_key", k="A", n=i, pause=0.002) for i in range(10_000)]
    specs += [spec("per_key", k="B", n=i, pause=0.002) for i in range(10)]
    workload.app.enqueue_many(specs)  # one call, in this order: A's all ahead of B's
    fleet = limited_fleet(workload, tmp_path, proxy, ["--workers", "2", "--lease", "10s"])
    try:
        fleet.start()
        fleet.wait_ready()
        count = "SELECT count(*) FROM {s}.runs WHERE key = %s"

        def decided() -> bool:
            # B's ten all started, or A ran on far past its 100th start without them (a
            # B run claimed before A's 100th has been recorded long before A's 200th).
            a, b = workload.scalar(count, "A") or 0, workload.scalar(count, "B") or 0
            return (a >= 100 and b >= 10) or a >= 200

        wait_for(decided, timeout=60, what="100 starts of A and 10 of B, or 200 of A")
    finally:
        fleet.kill()
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        order = db.execute(
            f"SELECT key, claimed FROM {workload.schema}.runs ORDER BY claimed, job_id"
        ).fetchall()
    a_starts = [t for k, t in order if k == "A"]
    b_starts = [t for k, t in order if k == "B"]
    hundredth_a = a_starts[99]
    b_before = sum(1 for t in b_starts if t < hundredth_a)
    print(f"B's starts before A's 100th: {b_before} of {len(b_starts)}")
    places = [i + 1 for i, (k, _) in enumerate(order) if k == "B"]
    assert b_before == 10, (
        f"only {b_before} of B's 10 jobs started before A's 100th start"
        f" (B's places in the start order: {places})"
    )
