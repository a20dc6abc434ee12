"""`forklift run` with real fork and real signals: restarts, attribution, shutdown, scaling."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import psycopg

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import released, scalar, still_serves, wait_state


def owner_pid(db: psycopg.Connection[Any], schema: str, job_id: int) -> int:
    owner = scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", job_id)
    return int(owner.split(":")[1])


def settle(db: psycopg.Connection[Any], sup: Any) -> None:
    """Until the one child's connection has been idle for a second: no claim under way,
    nor one about to start (the session's first "look now" included)."""
    (child,) = sup.children()

    def settled() -> bool:
        idle_for = scalar(
            db,
            "SELECT CASE WHEN bool_and(state = 'idle') "
            "THEN extract(epoch FROM now() - max(state_change)) END "
            "FROM pg_stat_activity WHERE application_name LIKE %s",
            f"forklift-worker:{child}:%",
        )
        return idle_for is not None and idle_for > 1.0

    wait_for(settled, what=f"child {child}'s connection idle")


def test_sigkilled_child_is_replaced_and_its_job_retried_at_once(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2")
    wait_for(lambda: len(sup.children()) == 2, what="two children")
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("effect", {"key": "k", "sleep": 5})
    # Killed while its handler runs (its progress says so), not between its claim and
    # its handler's start: a job whose handler never ran is released, not charged.
    wait_for(
        lambda: scalar(db, f"SELECT progress FROM {schema}.jobs WHERE id = %s", job_id),
        what="the handler started",
    )
    victim = owner_pid(db, schema, job_id)
    os.kill(victim, signal.SIGKILL)
    killed_at = time.monotonic()
    # Charged and ready again without waiting for the 30 s lease to expire.
    wait_for(
        lambda: (
            scalar(db, f"SELECT attempts FROM {schema}.jobs WHERE id = %s", job_id) == 2
            and scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "running"
        ),
        timeout=5,
        what="job running again",
    )
    assert time.monotonic() - killed_at < 2.0
    wait_state(db, schema, job_id, "succeeded")
    error = scalar(db, f"SELECT errors->0->>'error' FROM {schema}.jobs WHERE id = %s", job_id)
    assert "killed by SIGKILL" in error and "out of memory" in error
    assert scalar(db, f"SELECT count(*) FROM {schema}.effects") == 1
    wait_for(
        lambda: len(sup.children()) == 2 and victim not in sup.children(), what="replacement child"
    )
    sup.stop_cleanly(timeout=15)
    app.close()


def test_sigterm_releases_a_job_longer_than_grace_and_exits_zero(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    long_job = app.enqueue("sleep", {"seconds": 60})
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "1")
    wait_state(db, schema, long_job, "running")
    assert sup.stop_cleanly(timeout=15) < 1 + 4
    assert released(db, schema, long_job)
    assert "job.released" in sup.output()
    app.close()


def test_sigterm_lets_a_short_job_finish(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("effect", {"key": "short", "sleep": 1.0})
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "10")
    # Started, not just claimed: a job claimed but not begun is released on a stop.
    sup.wait_started("effect", job_id)
    sup.stop_cleanly(timeout=15)
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "succeeded"
    assert scalar(db, f"SELECT count(*) FROM {schema}.effects") == 1
    app.close()


def test_sigterm_past_the_deadline_kills_a_wedged_child_and_releases_its_job(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    # The handler holds the GIL in native code: the child cannot even run its signal
    # handler. The supervisor SIGKILLs it at grace + kill grace and releases the job.
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("wedge")
    sup = forklift_cli(
        "run", "tests.apps.basic:app", "--workers", "1", "--grace", "0.5", "--kill-grace", "0.5"
    )
    sup.wait_started("wedge", job_id)
    time.sleep(0.2)  # well inside the regex by now
    assert sup.stop_cleanly(timeout=15) < 0.5 + 0.5 + 3
    assert released(db, schema, job_id)
    assert "killed by SIGKILL" in sup.output()
    app.close()


def test_a_handler_that_exits_the_process_ends_dead_and_supervisor_survives(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    poison = app.enqueue("exit", {"code": 3}, max_attempts=3)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    wait_state(db, schema, poison, "dead", timeout=20)
    row = db.execute(
        f"SELECT attempts, last_error, jsonb_array_length(errors) FROM {schema}.jobs WHERE id = %s",
        (poison,),
    ).fetchone()
    assert row is not None
    # Two crashes (max_crashes' default) quarantine it before its third attempt.
    assert row[0] == 2 and row[2] == 2
    assert row[1].startswith("Quarantined: crashed its worker 2 times")
    assert "exited with code 3" in row[1]
    still_serves(app, db, schema, sup)
    sup.stop_cleanly(timeout=15)
    app.close()


def test_a_job_past_its_timeout_is_killed_and_charged(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("spin", max_attempts=2)  # the worker's task says timeout=1.0
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--kill-grace", "0.5")
    wait_state(db, schema, job_id, "dead", timeout=30)
    errors = scalar(db, f"SELECT errors FROM {schema}.jobs WHERE id = %s", job_id)
    assert len(errors) == 2
    assert all("timed out after 1 s" in e["error"] for e in errors)
    still_serves(app, db, schema, sup)
    sup.stop_cleanly(timeout=15)
    app.close()


def test_a_child_past_the_memory_limit_is_killed_and_its_job_charged(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("hog", max_attempts=2)
    sup = forklift_cli(
        "run", "tests.apps.basic:app", "--workers", "1", "--max-memory-per-child", "150"
    )
    wait_state(db, schema, job_id, "dead", timeout=30)
    errors = scalar(db, f"SELECT errors FROM {schema}.jobs WHERE id = %s", job_id)
    assert len(errors) == 2
    assert all("memory limit" in e["error"] and "SIGKILL" in e["error"] for e in errors)
    still_serves(app, db, schema, sup)
    sup.stop_cleanly(timeout=15)
    app.close()


def test_max_jobs_per_child_recycles_children(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    app.enqueue_many([("noop", {}) for _ in range(20)])
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--max-jobs-per-child", "5")
    wait_for(
        lambda: scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state = 'succeeded'") == 20,
        timeout=30,
        what="all jobs done",
    )
    wait_for(lambda: sup.output().count("child.started") >= 4, what="four children in turn")
    assert sup.output().count("reason=clean exit") >= 3
    assert "restart_backoff" not in sup.output()
    sup.stop_cleanly(timeout=15)
    app.close()


def test_workers_that_crash_while_booting_back_off_into_a_crash_loop(
    forklift_cli: Any,
) -> None:
    sup = forklift_cli("run", "tests.apps.boot_crash:app", "--workers", "2")
    wait_for(lambda: "supervisor.crash_loop" in sup.output(), timeout=30, what="crash loop seen")
    delays: dict[str, list[float]] = {}
    for line in sup.output().splitlines():
        if "child.restart_backoff" in line:
            slot = line.split("slot=")[1].split()[0]
            delays.setdefault(slot, []).append(float(line.split("delay=")[1].split()[0]))
    assert set(delays) == {"1", "2"}  # each slot backs off on its own
    for own in delays.values():
        assert own == sorted(own) and own[0] < own[-1]
    assert sup.popen.poll() is None
    sup.stop_cleanly(timeout=40)


def test_a_worker_wedged_before_its_boot_is_replaced_well_before_the_child_timeout(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    env: dict[str, str],
    forklift_cli: Any,
    tmp_path: Path,
) -> None:
    env["FORKLIFT_TEST_WEDGED"] = str(tmp_path / "wedged")
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("noop")
    sup = forklift_cli("run", "tests.apps.wedged_boot:app", "--workers", "1")
    started = time.monotonic()
    wait_state(db, schema, job_id, "succeeded", timeout=25)
    assert time.monotonic() - started < 20  # not the 30 s --child-timeout
    assert "since its fork (wedged before its boot)" in sup.output()
    assert sup.output().count("child.started") == 2
    sup.stop_cleanly(timeout=15)
    app.close()


def test_poison_jobs_that_kill_a_running_worker_are_no_crash_loop(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    # Each kills a worker that had booted: it ends dead; its worker is replaced at once.
    app = forklift.App(dsn, schema=schema)
    ids = app.enqueue_many(
        [forklift.JobSpec("exit", {"code": 9}, max_attempts=1) for _ in range(6)]
    )
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    for job_id in ids:
        wait_state(db, schema, job_id, "dead", timeout=20)
    still_serves(app, db, schema, sup)
    assert "restart_backoff" not in sup.output() and "crash_loop" not in sup.output()
    sup.stop_cleanly(timeout=15)
    app.close()


def test_one_external_kill_a_second_never_leaves_the_supervisor_without_workers(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "2")
    wait_for(lambda: len(sup.children()) == 2, what="two children")
    wait_for(lambda: "worker.started" in sup.output(), what="a worker booted")
    alive: list[int] = []
    previous = set(sup.children())
    for _ in range(16):  # a kill every half second, of a worker up since the last one
        time.sleep(0.1)  # past its boot: it was there at the last tick
        victims = sorted(previous & set(sup.children()))
        if victims:
            os.kill(victims[0], signal.SIGKILL)
        for _ in range(8):
            time.sleep(0.05)
            alive.append(len(sup.children()))
        previous = set(sup.children())
    assert "restart_backoff" not in sup.output() and "crash_loop" not in sup.output()
    assert sum(1 for n in alive if n >= 1) >= 0.95 * len(alive)
    assert sup.output().count("child.exited") >= 12
    app = forklift.App(dsn, schema=schema)
    still_serves(app, db, schema, sup)
    sup.stop_cleanly(timeout=15)
    app.close()


def test_a_new_job_wakes_an_idle_child_through_its_supervisor_and_a_replacement_too(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """The supervisor's LISTEN wakes a child's claim loop itself (its self-pipe): with a
    poll every 60 s, a job enqueued while the child is idle starts within seconds, and
    so it does in the child that replaces a killed one (its pipe is the fanout's too)."""
    app = forklift.App(dsn, schema=schema)

    def runs_soon(job_id: int) -> None:
        wait_state(db, schema, job_id, "succeeded", timeout=5)

    first = app.enqueue("noop")  # taken by the first claim after boot
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--poll-interval", "60")
    wait_state(db, schema, first, "succeeded")
    settle(db, sup)
    runs_soon(app.enqueue("noop"))  # the child is past its first claim: only news wakes it
    (victim,) = sup.children()
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: len(sup.children()) == 1 and victim not in sup.children(),
             what="a replacement child")  # fmt: skip
    wait_state(db, schema, app.enqueue("noop"), "succeeded")  # its first claim, or news
    settle(db, sup)
    runs_soon(app.enqueue("noop"))  # past it: news only
    sup.stop_cleanly(timeout=15)
    app.close()


def test_no_listen_children_are_not_woken_by_news(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """`run --no-listen`: the supervisor's session forwards no queue's news (it LISTENs
    for orders all the same); a job waits for the next poll, 60 s away here."""
    app = forklift.App(dsn, schema=schema)
    first = app.enqueue("noop")
    sup = forklift_cli(
        "run", "tests.apps.basic:app", "--workers", "1", "--poll-interval", "60", "--no-listen"
    )
    wait_state(db, schema, first, "succeeded")
    settle(db, sup)
    second = app.enqueue("noop")
    time.sleep(2.0)  # what is checked is that nothing happens meanwhile
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", second) == "ready"
    sup.stop_cleanly(timeout=15)
    app.close()


def test_ttin_and_ttou_add_and_remove_a_child(forklift_cli: Any) -> None:
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    wait_for(lambda: len(sup.children()) == 1, what="one child")
    sup.signal(signal.SIGTTIN)
    wait_for(lambda: len(sup.children()) == 2, what="two children")
    sup.signal(signal.SIGTTIN)
    wait_for(lambda: len(sup.children()) == 3, what="three children")
    sup.signal(signal.SIGTTOU)
    wait_for(lambda: len(sup.children()) == 2, what="back to two")
    sup.stop_cleanly(timeout=15)


def test_the_registry_lists_a_new_child_at_once_not_at_the_next_heartbeat(
    schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """Claims under a limit share its slots among the live workers the registry lists:
    a child added (SIGTTIN) is listed within a second or so, not up to a heartbeat
    interval (5 s) later."""

    def registered() -> set[int]:
        rows = db.execute(f"SELECT pid FROM {schema}.processes WHERE kind = 'worker'")
        return {int(r[0]) for r in rows.fetchall()}

    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1")
    wait_for(lambda: len(sup.children()) == 1 and registered() == set(sup.children()),
             what="one child, registered")  # fmt: skip
    for n in (2, 3):
        sup.signal(signal.SIGTTIN)
        wait_for(lambda: len(sup.children()) == n, what=f"{n} children")  # noqa: B023
        wait_for(
            lambda: registered() == set(sup.children()),
            timeout=1.5,
            what=f"{n} children registered",
        )
    sup.stop_cleanly(timeout=15)


def test_hup_rolls_children_onto_fresh_code_without_dropping_a_job(
    dsn: str,
    schema: str,
    db: psycopg.Connection[Any],
    forklift_cli: Any,
    env: dict[str, str],
    tmp_path: Path,
) -> None:
    code = tmp_path / "reloadable.py"
    source = (
        "import time\nimport forklift\napp = forklift.App()\nVERSION = {v}\n"
        "@app.task(name='which')\n"
        "def which(ctx, *, sleep: float = 0.0):\n"
        "    time.sleep(sleep)\n"
        "    with ctx.transaction() as conn:\n"
        "        conn.execute(f'INSERT INTO {{app.schema}}.effects (job_id, n) "
        "VALUES (%s, %s)', (ctx.job_id, VERSION))\n"
    )
    code.write_text(source.format(v=1))
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    sup = forklift_cli("run", "reloadable:app", "--workers", "2")
    wait_for(lambda: len(sup.children()) == 2, what="two children")
    old = set(sup.children())
    app = forklift.App(dsn, schema=schema)
    running = app.enqueue("which", {"sleep": 1.5})
    sup.wait_started("which", running)  # begun: the roll must let it finish
    code.write_text(source.format(v=2))
    sup.signal(signal.SIGHUP)
    wait_for(
        lambda: not old & set(sup.children()) and len(sup.children()) == 2,
        timeout=20,
        what="every child replaced",
    )
    wait_state(db, schema, running, "succeeded")
    assert scalar(db, f"SELECT n FROM {schema}.effects WHERE job_id = %s", running) == 1
    fresh = app.enqueue("which")
    wait_state(db, schema, fresh, "succeeded")
    assert scalar(db, f"SELECT n FROM {schema}.effects WHERE job_id = %s", fresh) == 2
    assert scalar(db, f"SELECT attempts FROM {schema}.jobs WHERE id = %s", running) == 1
    sup.stop_cleanly(timeout=15)
    app.close()


def test_an_app_that_does_not_import_exits_at_once(forklift_cli: Any) -> None:
    sup = forklift_cli("run", "tests.apps.does_not_exist:app", "--workers", "2")
    assert sup.wait(timeout=15) == 3  # the documented exit code: the app does not import
    out = sup.output()
    assert "cannot import tests.apps.does_not_exist:app: no module named" in out
    assert "Traceback" not in out and "child.started" not in out


def test_children_stop_when_the_supervisor_dies(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 60})
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "1")
    wait_state(db, schema, job_id, "running")
    child = sup.children()[0]
    sup.popen.kill()
    sup.popen.wait(timeout=5)
    # The orphan notices its parent is gone, stops gracefully and releases its job.
    wait_state(db, schema, job_id, "ready", timeout=10)
    wait_for(
        lambda: (
            not Path(f"/proc/{child}").exists()
            or "zombie" in Path(f"/proc/{child}/status").read_text()
        ),
        what="orphan exited",
    )
    app.close()


def test_hup_with_code_that_no_longer_imports_keeps_the_running_children(
    forklift_cli: Any, env: dict[str, str], tmp_path: Path
) -> None:
    code = tmp_path / "breakable.py"
    code.write_text("import forklift\napp = forklift.App()\n")
    env["PYTHONPATH"] = f"{tmp_path}{os.pathsep}{env['PYTHONPATH']}"
    sup = forklift_cli("run", "breakable:app", "--workers", "2")
    wait_for(lambda: len(sup.children()) == 2, what="two children")
    before = set(sup.children())
    code.write_text("import forklift\nraise RuntimeError('half-deployed')\n")
    sup.signal(signal.SIGHUP)
    wait_for(
        lambda: "reload: importing breakable:app failed" in sup.output(), what="reload refused"
    )
    assert "half-deployed" in sup.output()
    # The loop goes on (it serves a TTIN) and the old children are all still there.
    sup.signal(signal.SIGTTIN)
    wait_for(lambda: len(sup.children()) == 3, what="a third child")
    assert before <= set(sup.children())
    assert "child.retiring" not in sup.output()
    sup.stop_cleanly(timeout=15)


def test_sigquit_releases_at_once_and_exits(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 60})
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "30")
    wait_state(db, schema, job_id, "running")
    assert sup.stop_cleanly(signal.SIGQUIT, timeout=15) < 5  # not the 30 s grace
    assert released(db, schema, job_id)
    app.close()


def test_a_second_sigint_hurries_a_graceful_stop(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    app = forklift.App(dsn, schema=schema)
    job_id = app.enqueue("sleep", {"seconds": 60})
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--grace", "30")
    wait_state(db, schema, job_id, "running")
    sup.signal(signal.SIGINT)
    wait_for(lambda: "supervisor.stopping mode=graceful" in sup.output(), what="graceful stop")
    started = time.monotonic()
    sup.signal(signal.SIGINT)
    assert sup.wait(timeout=15) == 0
    assert time.monotonic() - started < 5
    assert "supervisor.stopping mode=fast" in sup.output()
    assert scalar(db, f"SELECT state FROM {schema}.jobs WHERE id = %s", job_id) == "ready"
    app.close()


def test_the_sessions_of_a_killed_child_end_with_it(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any, tmp_path: Path
) -> None:
    # The handler's effect transaction stays open in a grandchild that inherited its
    # socket: killing the worker does not end that session; the supervisor must, or it
    # holds its locks and the vacuum horizon for as long as its task allows.
    app = forklift.App(dsn, schema=schema)
    pidfile = tmp_path / "grandchild.pid"
    job_id = app.enqueue("fork_and_spin", {"pidfile": str(pidfile)}, max_attempts=1)
    sup = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--kill-grace", "0.5")
    wait_state(db, schema, job_id, "running")
    worker = owner_pid(db, schema, job_id)
    grandchild = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), what="fork"))
    sessions = (
        "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s"
        " AND state = 'idle in transaction'"
    )
    try:
        assert scalar(db, sessions, f"forklift-worker:{worker}%") == 1
        wait_state(db, schema, job_id, "dead", timeout=10)  # timed out, charged, killed
        wait_for(
            lambda: scalar(db, sessions, f"forklift-worker:{worker}%") == 0,
            timeout=3,
            what="the killed worker's effect session ended",
        )
        wait_for(lambda: "child.sessions_ended" in sup.output(), what="sessions_ended logged")
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed with its group, and reaped
            os.kill(grandchild, signal.SIGKILL)
    sup.stop_cleanly(timeout=15)
    app.close()


def test_a_timeout_kill_charges_the_overdue_job_and_no_bystander(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """The overdue job holds the GIL in native code, so its process cannot answer for
    itself; its sessions are ended at the kill. Before, a peer's check (and its own
    supervisor's) took that for a vanished worker and charged the bystander a crash."""
    app = forklift.App(dsn, schema=schema)
    args = ("--workers", "1", "--concurrency", "2", "--kill-grace", "3")
    home = forklift_cli("run", "tests.apps.basic:app", *args)
    # A peer replica serving another queue: it claims none of these, but looks after all.
    other = forklift_cli("run", "tests.apps.basic:app", "--workers", "1", "--queues", "other")
    bystander = app.enqueue("sleep", {"seconds": 30.0})
    wait_state(db, schema, bystander, "running")
    owner = scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", bystander)
    victim_pid = int(owner.split(":")[1])
    overdue = app.enqueue("backtrack", max_attempts=1)
    wait_state(db, schema, overdue, "running")
    wait_for(lambda: victim_pid not in home.children(), timeout=20, what="the kill")
    wait_state(db, schema, overdue, "dead")  # charged once its handler is gone
    row = db.execute(
        f"SELECT state, crashes, last_error FROM {schema}.jobs WHERE id = %s", (overdue,)
    ).fetchone()
    assert row is not None and row[0] == "dead" and row[1] == 0, row
    assert "timed out after 1 s" in row[2]
    wait_for(
        lambda: (
            scalar(db, f"SELECT attempts FROM {schema}.jobs WHERE id = %s", bystander) >= 1
            and scalar(db, f"SELECT lease_owner FROM {schema}.jobs WHERE id = %s", bystander)
            != owner
        ),
        timeout=20,
        what="the bystander released",
    )
    crashes, errors = db.execute(
        f"SELECT crashes, errors FROM {schema}.jobs WHERE id = %s", (bystander,)
    ).fetchone() or (None, None)
    assert crashes == 0 and errors == [], (crashes, errors)
    assert "WorkerLost" not in home.output() + other.output()
    app.close()


def test_long_effect_transactions_never_starve_lease_renewal(
    dsn: str, schema: str, db: psycopg.Connection[Any], forklift_cli: Any
) -> None:
    """Every effect connection is taken by a handler holding its transaction, more wait
    for one: the worker's own statements (renewals) have a connection of their own.
    Before, they shared one pool and the leases ran out under running handlers."""
    app = forklift.App(dsn, schema=schema)
    ids = [app.enqueue("hold", {"key": f"k{i}", "seconds": 6.0}) for i in range(8)]
    args = ("--workers", "1", "--concurrency", "8", "--pool", "2", "--lease", "3s")
    sup = forklift_cli("run", "tests.apps.basic:app", *args)
    running = f"SELECT count(*) FROM {schema}.jobs WHERE state = 'running'"
    wait_for(lambda: scalar(db, running) == 8, timeout=20, what="all eight running")
    expired = (
        f"SELECT count(*) FROM {schema}.jobs WHERE state = 'running'"
        " AND lease_until < clock_timestamp()"
    )
    deadline = time.monotonic() + 5.0  # past the lease: only renewals keep them held
    while time.monotonic() < deadline:
        assert scalar(db, expired) == 0, "a running job's lease ran out"
        time.sleep(0.1)
    wait_for(
        lambda: scalar(db, f"SELECT count(*) FROM {schema}.jobs WHERE state = 'running'") == 0,
        timeout=30,
        what="the jobs ended",
    )
    held = db.execute(
        f"SELECT id FROM {schema}.jobs WHERE id = ANY(%s) AND state = 'succeeded'", (ids,)
    ).fetchall()
    assert len(held) >= 2  # those that got an effect connection committed
    sup.stop_cleanly(timeout=30)
    app.close()
