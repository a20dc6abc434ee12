"""The operator commands through the real CLI against a real database: a failing job
found, read and retried to success, cancels, purges, the crash budget, and the CLI's
conventions (--help with an example and the --json shape, one-line errors, exit codes)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

from forklift._ids import operator
from forklift.testing import wait_for
from tests.acceptance.conftest import cli, cli_json, wait_state

APP = "tests.apps.operated:app"
JOB_KEYS = {
    "id", "queue", "task", "state", "priority", "attempts", "max_attempts", "crashes",
    "max_crashes", "created_at", "available_at", "started_at", "completed_at", "lease_owner",
    "last_error",
}  # fmt: skip
SHOW_KEYS = JOB_KEYS | {
    "args", "args_truncated", "idempotency_key", "timeout_seconds", "lease_until", "errors",
    "result", "progress", "batch_id", "limit_key", "worker", "leases_forgiven", "checkpoint",
    "checkpoint_at", "workflow_id", "step", "waiting_on", "upstream_failed",
    "snoozes", "snoozed_at", "unique_key", "unique_states", "fair_key", "fair_weight",
    "fair_turn", "requires",
}  # fmt: skip
ERROR_KEYS = {"attempt", "at", "worker", "error", "traceback"}


def enqueue(env: dict[str, str], task: str, args: str = "{}") -> int:
    result = cli(env, "enqueue", APP, task, "--args", args)
    assert result.returncode == 0, result.stderr
    return int(result.stdout)


def documented(keys: set[str], *command: str) -> None:
    """Every key of a --json answer is named in the command's --help."""
    text = cli({}, *command, "--help").stdout
    missing = {k for k in keys if k not in text}
    assert not missing, f"{' '.join(command)} --help does not document {missing}"


def test_a_job_failing_to_dead_is_found_read_and_retried_to_success(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any, tmp_path: Path
) -> None:
    flag = tmp_path / "ready"
    sup = forklift_cli("run", APP, "--workers", "1")
    job_id = enqueue(env, "flaky", f'{{"unless": "{flag}", "dsn": "postgresql://u:pw1@h/d"}}')
    wait_state(db, schema, job_id, "dead", timeout=20)
    page = cli_json(env, "jobs", "list", "--state", "dead", "--error", "is not there")
    assert [j["id"] for j in page["jobs"]] == [job_id] and page["next_before"] is None
    assert set(page["jobs"][0]) == JOB_KEYS
    documented(JOB_KEYS | {"next_before"}, "jobs", "list")
    table = cli(env, "jobs", "list", "--task", "flaky").stdout.splitlines()
    assert table[0].split()[:4] == ["id", "state", "queue", "task"]
    assert table[1].split()[:5] == [str(job_id), "dead", "default", "flaky", "2/2"]
    assert "earlier" not in table[1]  # why it is dead

    shown = cli_json(env, "jobs", "show", str(job_id))
    assert set(shown) == SHOW_KEYS and shown["state"] == "dead" and shown["attempts"] == 2
    assert "pw1" not in shown["args"] and "postgresql://u:***@h/d" in shown["args"]
    assert [set(e) for e in shown["errors"]] == [ERROR_KEYS, ERROR_KEYS]
    assert all(e["worker"] and "RuntimeError" in e["traceback"] for e in shown["errors"])
    documented(SHOW_KEYS | ERROR_KEYS, "jobs", "show")
    text = cli(env, "jobs", "show", str(job_id)).stdout
    assert "attempts     2 of 2" in text and "Traceback (most recent call last)" in text
    assert "pw1" not in text

    flag.write_text("now")
    retried = cli_json(env, "jobs", "retry", str(job_id))
    assert retried == [
        {
            "id": job_id,
            "result": "retried",
            "was": "dead",
            "attempts_before": 2,
            "crashes_before": 0,
            "checkpoint": None,
            "unique_key_held_by": None,
        }
    ]
    documented(set(retried[0]), "jobs", "retry")
    wait_state(db, schema, job_id, "succeeded", timeout=10)
    # The error it still carries is an earlier attempt's, and the retry an operator's.
    [row] = cli(env, "jobs", "list", "--task", "flaky").stdout.splitlines()[1:]
    assert row.split()[:2] == [str(job_id), "succeeded"] and "earlier: RuntimeError" in row
    text = cli(env, "jobs", "show", str(job_id)).stdout
    assert "last error   earlier: RuntimeError" in text
    [retry] = [line for line in text.splitlines() if "retried by" in line]
    assert retry.startswith(f"  retried by {operator()} at ")
    assert retry.endswith(": attempts 2 and crashes 0 reset to 0")
    assert "on worker -" not in text
    again = cli(env, "jobs", "retry", str(job_id), "999999")
    assert again.returncode == 1
    assert again.stdout.splitlines() == [
        f"job {job_id}: not retried: it is succeeded (only dead and cancelled jobs are)",
        "job 999999: not retried: no such job",
    ]
    sup.stop_cleanly(timeout=30)


def test_cancel_a_ready_job_retry_all_dead_and_purge(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str
) -> None:
    ready = enqueue(env, "polite", '{"key": "k"}')
    dead = [enqueue(env, "flaky", '{"unless": "/nowhere"}') for _ in range(3)]
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'dead', completed_at = now() - interval '2 days',"
        " attempts = 2 WHERE id = ANY(%s)",
        (dead,),
    )
    answer = cli_json(env, "jobs", "cancel", str(ready), str(dead[0]), code=1)
    assert answer == [
        {"id": ready, "result": "cancelled", "was": "ready", "worker": None},
        {"id": dead[0], "result": "not_cancellable", "was": "dead", "worker": None},
    ]
    documented(set(answer[0]), "jobs", "cancel")
    shown = cli(env, "jobs", "show", str(ready)).stdout.splitlines()
    assert shown[-2:] == ["errors (1, oldest first):", shown[-1]]
    assert shown[-1].startswith(f"  cancelled by {operator()} at ")
    dry = cli_json(env, "jobs", "purge", "--state", "dead", "--older-than", "1d", "--dry-run")
    assert (dry["jobs"], dry["dry_run"], dry["batches"]) == (3, True, 0)
    documented(set(dry), "jobs", "purge")
    retried = cli(env, "jobs", "retry", "--all-dead", "--task", "flaky")
    assert retried.returncode == 0
    assert [line.split(":")[0] for line in retried.stdout.splitlines()] == [
        f"job {i}" for i in dead
    ]
    db.execute(
        f"UPDATE {schema}.jobs SET state = 'cancelled', completed_at = now() - interval '2 days'"
    )
    purged = cli(env, "jobs", "purge", "--state", "cancelled", "--older-than", "1d")
    assert purged.stdout.startswith("purged 4 cancelled jobs completed before ")
    assert purged.stdout.rstrip().endswith(", in 1 batch of at most 500")
    assert db.execute(f"SELECT count(*) FROM {schema}.jobs").fetchone() == (0,)


CHECKPOINT = '{"v":1,"cursors":{"iterate":41},"steps":{"download":"x"},"state":{"password":"pw9"}}'


def checkpointed(db: psycopg.Connection[Any], schema: str, job_id: int, state: str) -> None:
    """The job in `state` with a checkpoint its worker wrote 12 s ago."""
    db.execute(
        f"UPDATE {schema}.jobs SET state = %s::{schema}.job_state, checkpoint = %s::jsonb,"
        " checkpoint_at = now() - interval '12 seconds',"
        " completed_at = CASE WHEN %s = 'dead' THEN now() END WHERE id = %s",
        (state, CHECKPOINT, state, job_id),
    )


def has_checkpoint(db: psycopg.Connection[Any], schema: str, job_id: int) -> tuple[bool, bool]:
    row = db.execute(
        f"SELECT checkpoint IS NOT NULL, checkpoint_at IS NOT NULL FROM {schema}.jobs"
        " WHERE id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None
    return bool(row[0]), bool(row[1])


def test_a_checkpoint_is_shown_kept_by_a_retry_cleared_from_scratch_and_by_cancel(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str
) -> None:
    resumed, restarted, cancelled = (enqueue(env, "polite", f'{{"key": "{k}"}}') for k in "abc")
    checkpointed(db, schema, resumed, "dead")
    text = cli(env, "jobs", "show", str(resumed)).stdout.splitlines()
    head = text.index("errors: none") + 1  # the checkpoint's block ends what `show` says
    assert re.fullmatch(r"checkpoint: written \S+ \S+Z \(1\ds ago\), version 1", text[head])
    assert not any("pw9" in line for line in text)
    assert text[head + 1 :] == [
        '  cursors      {"iterate": 41}',
        "  steps done   download",
        '  state        {"password": "***"}',
    ]
    shown = cli_json(env, "jobs", "show", str(resumed))
    assert shown["checkpoint"] == {
        "v": 1, "cursors": {"iterate": 41}, "steps": {"download": "x"},
        "state": {"password": "***"},
    }  # fmt: skip
    assert shown["checkpoint_at"].endswith("Z")
    assert cli_json(env, "jobs", "show", str(cancelled))["checkpoint"] is None
    assert "checkpoint" not in cli(env, "jobs", "show", str(cancelled)).stdout

    plain = cli(env, "jobs", "retry", str(resumed))
    assert plain.stdout.rstrip().endswith(", resumes from its checkpoint"), plain.stdout
    assert has_checkpoint(db, schema, resumed) == (True, True)
    checkpointed(db, schema, restarted, "dead")
    [answer] = cli_json(env, "jobs", "retry", str(restarted), "--from-scratch")
    assert (answer["result"], answer["checkpoint"]) == ("retried", "cleared")
    assert has_checkpoint(db, schema, restarted) == (False, False)
    after = cli(env, "jobs", "show", str(restarted)).stdout
    assert "reset to 0, checkpoint cleared" in after and "checkpoint: written" not in after

    checkpointed(db, schema, cancelled, "ready")
    answer = cli_json(env, "jobs", "cancel", str(cancelled))
    assert answer[0]["result"] == "cancelled"
    assert has_checkpoint(db, schema, cancelled) == (False, False)


def test_jobs_list_finds_the_scheduled_jobs_status_counts(env: dict[str, str]) -> None:
    due = enqueue(env, "polite", '{"key": "a"}')
    result = cli(env, "enqueue", APP, "polite", "--args", '{"key": "b"}', "--delay", "1h")
    later = int(result.stdout)
    [status] = cli_json(env, "status")
    assert (status["ready"], status["scheduled"]) == (1, 1)
    assert [j["id"] for j in cli_json(env, "jobs", "list", "--state", "scheduled")["jobs"]] == [
        later
    ]
    ready = cli_json(env, "jobs", "list", "--state", "ready")["jobs"]
    assert [j["id"] for j in ready] == [later, due]  # ready: due or not


def test_a_job_that_kills_its_worker_each_time_is_quarantined_at_its_max_crashes(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    sup = forklift_cli("run", APP, "--workers", "1")
    job_id = enqueue(env, "crash")  # max_attempts=5, max_crashes=2
    wait_state(db, schema, job_id, "dead", timeout=30)
    shown = cli_json(env, "jobs", "show", str(job_id))
    assert (shown["attempts"], shown["max_attempts"]) == (2, 5)
    assert (shown["crashes"], shown["max_crashes"]) == (2, 2)
    assert shown["last_error"].startswith(
        "Quarantined: crashed its worker 2 times (max_crashes 2); "
        "last: WorkerDied: worker process exited with code 7"
    )
    workers = [e["worker"] for e in shown["errors"]]
    assert len(workers) == 2 and len(set(workers)) == 2  # two worker processes died of it
    assert "crashes      2 of 2" in cli(env, "jobs", "show", str(job_id)).stdout
    wait_for(lambda: f"job.quarantined job={job_id}" in sup.output(), what="logged")
    sup.stop_cleanly(timeout=30)


@pytest.mark.parametrize(
    "command",
    [
        ["jobs"], ["jobs", "list"], ["jobs", "show"], ["jobs", "retry"], ["jobs", "cancel"],
        ["jobs", "purge"], ["batches"], ["batches", "list"], ["batches", "show"],
        ["batches", "cancel"], ["queues"], ["top"],
    ],
)  # fmt: skip
def test_every_operator_command_has_help_with_an_example(command: list[str]) -> None:
    result = cli({}, *command, "--help")
    assert result.returncode == 0
    assert "example" in result.stdout and f"forklift {' '.join(command)}" in result.stdout


def test_operator_errors_are_one_line_with_their_exit_code(env: dict[str, str]) -> None:
    for args, code, text in [
        (["jobs", "show", "424242"], 1, "no job 424242 in schema"),
        (["jobs", "retry"], 2, "name job ids, or --all-dead"),
        (["jobs", "retry", "1", "--queue", "q"], 2, "for --all-dead only"),
        (["jobs", "list", "--state", "lost"], 2, "invalid choice"),
        (["queues", "pause"], 2, "needs the queue's name"),
        (["queues", "pause", "a\tb"], 1, "contains a control character"),
    ]:
        result = cli(env, *args)
        assert result.returncode == code, (args, result.stderr)
        assert text in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stderr
        if code == 1:
            assert len(result.stderr.strip().splitlines()) == 1
