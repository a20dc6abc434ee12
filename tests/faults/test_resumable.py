"""Resumable jobs under real faults (forklift issue 38): `forklift run` supervisors of
tests/apps/resumable.py whose workers are SIGKILLed, SIGTERMed, SIGSTOPped past their
lease, or cut off by a database restart, mid-loop or mid-step. Whatever is done to
them, every item's effect commits once, a graceful stop spends no attempt, a lost lease
writes no checkpoint, and little work is done again (workers/checkpoints.py). The
single-worker cases are in tests/integration/test_checkpoints.py."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import secrets
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest

from forklift._ids import owner_process
from forklift.embedded import Cluster
from forklift.testing import wait_for
from tests.apps import resumable
from tests.apps.resumable import Line
from tests.faults.harness import Fleet, Supervisor, Workload
from tests.faults.injector import Fault, Injector

APP = "tests.apps.resumable:app"


@pytest.fixture
def fleet_args() -> list[str]:
    # One worker per supervisor: the job's worker is the supervisor's only child.
    return ["--workers", "1", "--lease", "3s", "--grace", "5s"]


@pytest.fixture
def log(fleet: Fleet, tmp_path: Path) -> Path:
    """The handlers' log; the fleet runs the resumable app, whose handlers write it."""
    path = tmp_path / "resumable.log"
    fleet.app = APP
    fleet.env[resumable.LOG_ENV] = str(path)
    return path


# -- reading the job -----------------------------------------------------------------------


def job(workload: Workload, job_id: int) -> dict[str, Any]:
    """The job's state, attempts, lease owner, checkpoint and result ({} while the
    database is away)."""
    found = workload.scalar(
        "SELECT json_build_object('state', state, 'attempts', attempts, 'owner', lease_owner,"
        " 'checkpoint', checkpoint, 'result', result) FROM {s}.jobs WHERE id = %s",
        job_id,
    )
    return dict(found or {})


def cursor(workload: Workload, job_id: int) -> int:
    """The loop's checkpointed cursor (-1: none yet, or the database is away)."""
    found = (job(workload, job_id).get("checkpoint") or {}).get("cursors", {}).get("iterate")
    return found if isinstance(found, int) else -1


def cursor_past(workload: Workload, job_id: int, mark: int, fleet: Fleet) -> int:
    """Wait until the checkpointed cursor is at `mark` or past it; the cursor."""

    def past() -> int | None:
        fleet.check_alive()
        at = cursor(workload, job_id)
        return at if at >= mark else None

    found: int = wait_for(past, 20, 0.02, f"the cursor past {mark}")
    return found


def started(log: Path, pid: int, item: int) -> bool:
    """Whether worker `pid` has begun item `item` or a later one."""
    return any(s.pid == pid and s.item >= item for s in of(log, "start"))


def holder(workload: Workload, job_id: int, sup: Supervisor) -> int:
    """The pid of `sup`'s worker that holds the job now."""
    owner = job(workload, job_id)["owner"]
    pid = owner_process(owner)[1]
    assert pid in sup.workers(), (owner, sup.workers())
    return pid


def finished(workload: Workload, job_id: int, fleet: Fleet, timeout: float = 30) -> dict[str, Any]:
    def done() -> bool:
        fleet.check_alive()
        return job(workload, job_id).get("state") == "succeeded"

    wait_for(done, timeout, 0.05, f"job {job_id} succeeded")
    return job(workload, job_id)


def effects(workload: Workload, prefix: str) -> Counter[str]:
    """How many times each effect of `prefix` committed."""
    rows = workload.scalar(
        "SELECT json_object_agg(key, n) FROM"
        " (SELECT key, count(*) AS n FROM {s}.effects WHERE key LIKE %s GROUP BY key) AS e",
        prefix + "-%",
    )
    return Counter(rows or {})


def of(log: Path, what: str) -> list[Line]:
    return [line for line in resumable.lines(log) if line.what == what]


def enqueue(workload: Workload, task: str, **args: Any) -> int:
    return workload.app.enqueue(task, args, max_attempts=10, max_crashes=6)


# -- 1. SIGKILL mid-loop -------------------------------------------------------------------


def test_a_loop_killed_three_times_commits_each_item_once_and_redoes_little(
    workload: Workload, fleet: Fleet, log: Path
) -> None:
    # Each item's effect commits with the cursor every 0.2 s (its own effect block,
    # batched into the job's effect transaction): a kill loses at most the items since
    # that commit and the one under way, and each of those runs again once. The kills
    # land 1, 2 and 3 items into a batch.
    n, pause, every, kills = 80, 0.05, 0.2, 3
    key = secrets.token_hex(4)
    (sup,) = fleet.start()
    fleet.wait_ready()
    job_id = enqueue(workload, "tiles", key=key, n=n, pause=pause, every=every)
    mark = 10
    for into in range(1, kills + 1):
        at = cursor_past(workload, job_id, mark, fleet)
        pid = holder(workload, job_id, sup)
        into_batch = functools.partial(started, log, pid, at + 1 + into)
        wait_for(into_batch, 10, 0.01, "an item into the batch")
        os.kill(pid, signal.SIGKILL)
        mark = at + into + 12  # the next worker gets past what this one did
    done = finished(workload, job_id, fleet)
    assert done["attempts"] == kills + 1, done  # each death charged, the last succeeded
    assert effects(workload, key) == Counter({f"{key}-{i}": 1 for i in range(n)})
    starts = of(log, "start")
    redone = len(starts) - n
    per_interval = math.ceil(every / pause)  # items of one uncommitted batch, at most
    assert redone <= kills * per_interval + kills, Counter(s.item for s in starts)
    assert len({s.pid for s in starts}) == kills + 1  # each kill was of the worker running it


# -- 2. SIGTERM within the grace ----------------------------------------------------------


def test_a_sigterm_gives_the_loop_back_at_its_cursor_without_spending_an_attempt(
    workload: Workload, fleet: Fleet, log: Path
) -> None:
    n = 150
    key = secrets.token_hex(4)
    (first,) = fleet.start()
    fleet.wait_ready()
    job_id = workload.app.enqueue("walk", {"key": key, "n": n, "pause": 0.02}, max_attempts=1)
    cursor_past(workload, job_id, 30, fleet)
    stopped = holder(workload, job_id, first)
    first.signal(signal.SIGTERM)
    assert first.wait(timeout=20) == 0, first.output()[-3000:]
    given_back = job(workload, job_id)
    assert (given_back["state"], given_back["attempts"]) == ("ready", 0), given_back
    at = cursor(workload, job_id)
    done_first = [d.item for d in of(log, "done") if d.pid == stopped]
    assert done_first == list(range(at + 1))  # the cursor is the last item that finished
    assert [s.item for s in of(log, "start") if s.pid == stopped] == done_first  # none begun

    fleet.replace(first)
    fleet.wait_ready()
    finished(workload, job_id, fleet)
    resumed = [s for s in of(log, "start") if s.pid != stopped]
    assert resumed[0].item == at + 1, resumed[:3]
    assert [d.item for d in of(log, "done")] == list(range(n))  # each item once, in order


# -- 3. Lease lost to a SIGSTOP ------------------------------------------------------------

# Every checkpoint that lands in the job's row, in order, with the owner it landed under.
CHECKPOINT_LOG = """
CREATE TABLE {s}.checkpoint_log (
    n bigserial PRIMARY KEY, owner text, pid integer, item integer
);
CREATE FUNCTION {s}.checkpoint_logged() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {s}.checkpoint_log (owner, pid, item) VALUES (NEW.lease_owner,
        (NEW.checkpoint->'state'->>'pid')::integer, (NEW.checkpoint->'state'->>'item')::integer);
    RETURN NEW;
END $$;
CREATE TRIGGER checkpoint_logged AFTER UPDATE OF checkpoint ON {s}.jobs FOR EACH ROW
    WHEN (NEW.checkpoint IS NOT NULL AND NEW.checkpoint IS DISTINCT FROM OLD.checkpoint)
    EXECUTE FUNCTION {s}.checkpoint_logged();
"""


def landed(workload: Workload) -> list[tuple[str, int, int]]:
    """(owner, pid, item) of each checkpoint written, in the order they landed."""
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        rows = db.execute(
            f"SELECT owner, pid, item FROM {workload.schema}.checkpoint_log ORDER BY n"
        )
        return [(owner, pid, item) for owner, pid, item in rows]


@contextlib.contextmanager
def frozen(pid: int) -> Iterator[None]:
    """`pid` stopped (SIGSTOP) until the block ends."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def test_a_worker_frozen_past_its_lease_never_writes_over_the_new_owners_checkpoint(
    workload: Workload, fleet: Fleet, log: Path
) -> None:
    # A frozen worker's supervisor holds its liveness lock since before the lease ran
    # out: that vouches for nothing (test_vouched_leases.py), so a peer takes the job.
    # Thawed, the old worker checkpoints every 0.02 s against the new owner's 0.1 s: only
    # the fence keeps its later versions from landing over the new owner's.
    with psycopg.connect(workload.dsn, autocommit=True) as db:
        db.execute(CHECKPOINT_LOG.format(s=workload.schema))
    key = secrets.token_hex(4)
    (old,) = fleet.start()
    fleet.wait_ready()
    job_id = workload.app.enqueue(
        "stamp", {"key": key, "n": 60, "first": 0.02, "later": 0.1}, max_attempts=5
    )
    wait_for(lambda: len(landed(workload)) >= 5, 20, 0.02, "the first owner's checkpoints")
    (new,) = fleet.start()
    fleet.wait_ready()
    stale = holder(workload, job_id, old)

    with frozen(stale):

        def taken() -> int | None:
            fleet.check_alive()
            owner, pid, _ = (landed(workload) or [("", 0, 0)])[-1]
            return pid if pid in new.workers() and owner_process(owner)[1] == pid else None

        taker = wait_for(taken, 20, 0.05, "the new owner's first checkpoint")

    ends = wait_for(
        lambda: [e for e in resumable.lines(log) if e.pid == stale and e.what.startswith("end")],
        10,
        0.02,
        "the thawed handler to end",
    )
    assert [e.what for e in ends] == ["end:LeaseLost"]  # it tried, and was refused
    finished(workload, job_id, fleet)
    found = landed(workload)
    since = found.index(next(row for row in found if row[1] == taker))
    assert {pid for _, pid, _ in found[since:]} == {taker}, found
    assert {pid for _, pid, _ in found[:since]} == {stale}, found
    begun = [b.item for b in of(log, "begin") if b.pid == taker]
    assert begun == [found[since - 1][2] + 1]  # resumed after the old owner's last


# -- 4. The database restarted mid-job -----------------------------------------------------


@pytest.mark.parametrize("fault", ["restart", "terminate"])
def test_a_loop_cut_off_from_the_database_resumes_with_each_effect_once(
    fault: Literal["restart", "terminate"],
    cluster: Cluster,
    workload: Workload,
    fleet: Fleet,
    injector: Injector,
    log: Path,
) -> None:
    # The cursor commits with the effects every second (20 items): the cut comes three
    # items past a commit, the job's effect transaction open with the items since.
    n, key = 80, secrets.token_hex(4)
    (sup,) = fleet.start()
    fleet.wait_ready()
    job_id = enqueue(workload, "tiles", key=key, n=n, pause=0.05, every=1.0)
    cut_at = cursor_past(workload, job_id, 10, fleet)
    pid = holder(workload, job_id, sup)
    wait_for(lambda: started(log, pid, cut_at + 3), 10, 0.01, "items past the commit")
    if fault == "restart":
        cluster.restart("immediate")  # a crash: every session ends, nothing flushed
    else:
        injector.inject(Fault.TERMINATE)
    done = finished(workload, job_id, fleet)
    assert effects(workload, key) == Counter({f"{key}-{i}": 1 for i in range(n)})
    assert done["result"] == n
    # The cut ended the run under way: failed its attempt, or, when it ended a commit
    # whose answer was then lost, released the job (no attempt charged: the job did
    # nothing wrong), to run again as the same attempt. Either way the next run starts
    # where the items go back or the attempt changes.
    starts = of(log, "start")
    again = next(
        (
            i
            for i in range(1, len(starts))
            if starts[i].attempt != starts[i - 1].attempt or starts[i].item <= starts[i - 1].item
        ),
        None,
    )
    assert again is not None, (done, starts[-3:])  # the cut ended the run under way
    assert starts[again].item > cut_at, starts[again - 2 : again + 2]  # resumed, not from 0


# -- 5. Steps under SIGKILL ----------------------------------------------------------------


def test_steps_done_before_a_kill_are_not_run_again(
    workload: Workload, fleet: Fleet, log: Path
) -> None:
    key = secrets.token_hex(4)
    (sup,) = fleet.start()
    fleet.wait_ready()
    job_id = enqueue(workload, "pipeline", key=key, hold=60.0)
    (publishing,) = wait_for(lambda: of(log, "step:publish"), 20, 0.02, "the third step")
    assert publishing.pid == holder(workload, job_id, sup)
    os.kill(publishing.pid, signal.SIGKILL)
    done = finished(workload, job_id, fleet)
    assert done["attempts"] == 2, done
    assert done["result"] == [f"{key}-fetched", 2, 3]
    ran = Counter((line.what, line.attempt) for line in resumable.lines(log))
    assert ran == Counter({("step:fetch", 1): 1, ("step:store", 1): 1, ("step:publish", 1): 1,
                           ("step:publish", 2): 1})  # fmt: skip
    assert effects(workload, key) == Counter({f"{key}-stored": 1})
