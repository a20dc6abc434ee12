"""Queue limits through the real CLI: `queues limit Q` sets, keeps, removes and clears
them, refuses bad input (exit 2, nothing written) and queues nobody uses (unless
--force); `queues`, `status`, `top` and a running supervisor's /metrics show them."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import forklift
from forklift.testing import wait_for
from tests.acceptance.conftest import cli, cli_json, get, metrics_url

LIMIT_KEYS = {"queue", "action", "concurrency", "rate", "per", "max_depth", "rejected"}
HOSTILE_TASK = "charge\x1b]2;PWNED\x07\u202e"


def row(db: psycopg.Connection[Any], schema: str, queue: str) -> tuple[Any, ...] | None:
    """The queue's limits row as stored: concurrency, rate, per, max_depth."""
    return db.execute(
        f"SELECT concurrency, rate, per, max_depth FROM {schema}.limits "
        "WHERE scope = 'queue' AND name = %s",
        (queue,),
    ).fetchone()


def said(env: dict[str, str], *args: str) -> str:
    result = cli(env, *args)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.fixture
def emails(dsn: str, schema: str) -> str:
    """A queue in use: it has a job (nobody serves it)."""
    app = forklift.App(dsn, schema=schema)
    app.enqueue("noop", queue="emails")
    app.close()
    return "emails"


def test_limits_are_set_kept_removed_one_by_one_and_cleared(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, emails: str
) -> None:
    shown = said(env, "queues", "limit", emails, "--concurrency", "4", "--rate", "10/s",
                 "--max-depth", "10000")  # fmt: skip
    assert shown == "emails: concurrency 4, 10/1s, max depth 10000"
    assert row(db, schema, emails) == (4, 10, 1.0, 10000)
    # A flag not given keeps its value.
    now = cli_json(env, "queues", "limit", emails, "--rate", "100/60s")
    assert now == {
        "queue": "emails", "action": "limit", "concurrency": 4, "rate": 100, "per": 60.0,
        "max_depth": 10000, "rejected": 0,
    }  # fmt: skip
    assert said(env, "queues", "limit", emails, "--rate", "5/m") == (
        "emails: concurrency 4, 5/60s, max depth 10000"
    )
    assert said(env, "queues", "limit", emails, "--rate", "2/h") == (
        "emails: concurrency 4, 2/3600s, max depth 10000"
    )
    # `none` removes that one limit.
    assert said(env, "queues", "limit", emails, "--rate", "none") == (
        "emails: concurrency 4, max depth 10000"
    )
    assert row(db, schema, emails) == (4, None, None, 10000)
    # None left: the row goes, as --clear removes it.
    gone = cli_json(env, "queues", "limit", emails, "--concurrency", "none", "--max-depth", "none")
    assert gone == {**now, "concurrency": None, "rate": None, "per": None, "max_depth": None}
    assert row(db, schema, emails) is None
    said(env, "queues", "limit", emails, "--concurrency", "2")
    assert said(env, "queues", "limit", emails, "--clear") == (
        "emails: no limits (removed: concurrency 2)"
    )
    assert row(db, schema, emails) is None
    assert said(env, "queues", "limit", "emials", "--clear") == ("emials: no limits, it had none")
    assert set(cli_json(env, "queues", "limit", emails, "--clear")) == LIMIT_KEYS


def test_the_limits_show_in_queues_status_and_top_with_the_tasks_below(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, emails: str
) -> None:
    said(env, "queues", "limit", emails, "--concurrency", "4", "--rate", "10/s",
         "--max-depth", "10000")  # fmt: skip
    db.execute(f"UPDATE {schema}.limits SET rejected = 3 WHERE name = 'emails'")
    # Tasks' limits as their workers write them; one with a name stored by hand.
    db.execute(
        f"""INSERT INTO {schema}.limits (scope, name, concurrency, rate, per, keyed, key_arg)
        VALUES ('task', 'charge', 1, NULL, NULL, true, 'account'),
               ('task', %s, NULL, 5, 2.0, false, NULL)""",
        (HOSTILE_TASK,),
    )
    limits = {"concurrency": 4, "rate": 10, "per": 1.0, "max_depth": 10000, "rejected": 3}
    [queue] = cli_json(env, "queues")
    assert {k: queue[k] for k in limits} == limits and queue["ready"] == 1
    [status] = cli_json(env, "status")
    assert {k: status[k] for k in limits} == limits
    [top] = cli_json(env, "top")["queues"]
    assert {k: top[k] for k in limits} == limits
    for help_of in (["queues"], ["top"]):
        text = cli({}, *help_of, "--help").stdout
        assert all(k in text for k in limits), help_of

    cell = "concurrency 4, 10/1s, max depth 10000 (3 rejected)"
    tasks = ["task charge: concurrency 1 per account", "task charge\\x1b]2;PWNED\\x07\\u202e: 5/2s"]
    for command in ("queues", "status"):
        lines = said(env, command).splitlines()
        assert lines[0].split()[0] == "queue" and lines[0].endswith("limits"), lines
        assert lines[1].startswith("emails ") and lines[1].endswith(cell), lines
        assert lines[2:] == ["", *tasks], lines
        assert "\x1b" not in "\n".join(lines)
    env = {**env, "COLUMNS": "160"}
    lines = said(env, "top", "--once").splitlines()
    [head] = [line for line in lines if line.startswith("QUEUE ")]
    assert head.endswith("LIMITS")
    [shown] = [line for line in lines if line.startswith("emails ")]
    assert shown.endswith(cell)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--concurrency", "0"], "argument --concurrency: '0': expected a whole number"),
        (["--concurrency", "-2"], "argument --concurrency: '-2': expected a whole number"),
        (["--max-depth", "0"], "argument --max-depth: '0': expected a whole number"),
        (["--max-depth", "lots"], "argument --max-depth: 'lots': expected a whole number"),
        (["--rate", "10/x"], "argument --rate: '10/x': expected N/s, N/Ns, N/m or N/h"),
        (["--rate", "0/s"], "argument --rate: '0/s': expected N/s"),
        (["--rate", "10/0s"], "argument --rate: '10/0s': expected N/s"),
        (["--rate", "10"], "argument --rate: '10': expected N/s"),
        ([], "queues limit: nothing to set"),
        (["--clear", "--concurrency", "3"], "--clear removes every limit of the queue"),
        (["--concurrency", "9", "--rate", "1/x"], "argument --rate: '1/x'"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    env: dict[str, str],
    db: psycopg.Connection[Any],
    schema: str,
    emails: str,
    args: list[str],
    error: str,
) -> None:
    said(env, "queues", "limit", emails, "--concurrency", "4")
    result = cli(env, "queues", "limit", emails, *args)
    assert result.returncode == 2, result.stderr
    assert error in result.stderr and "Traceback" not in result.stderr
    assert result.stdout == ""
    assert row(db, schema, emails) == (4, None, None, None)


def test_the_limit_flags_belong_to_queues_limit_and_it_needs_a_queue(env: dict[str, str]) -> None:
    for args, error in [
        (["queues", "--concurrency", "3"], "--concurrency: for queues limit QUEUE only"),
        (["queues", "pause", "emails", "--rate", "1/s"], "--rate: for queues limit QUEUE only"),
        (["queues", "limit", "--concurrency", "3"], "queues limit needs the queue's name"),
    ]:
        result = cli(env, *args)
        assert result.returncode == 2 and error in result.stderr, (args, result.stderr)


def test_limiting_a_queue_nobody_uses_is_refused_with_the_close_names_unless_forced(
    env: dict[str, str], db: psycopg.Connection[Any], schema: str, emails: str
) -> None:
    result = cli(env, "queues", "limit", "emials", "--concurrency", "2")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip() == (
        "forklift: error: queue 'emials' has no jobs and no worker serves it (did you mean "
        "'emails'?); to limit it anyway (ahead of a deploy that brings its workers), pass "
        "--force"
    )
    assert row(db, schema, "emials") is None
    assert [q["queue"] for q in cli_json(env, "queues")] == ["emails"]
    forced = said(env, "queues", "limit", "video", "--max-depth", "50", "--force")
    assert forced == "video: max depth 50"
    # Limited, the queue is in use: changing its limits needs no --force.
    assert said(env, "queues", "limit", "video", "--concurrency", "1") == (
        "video: concurrency 1, max depth 50"
    )
    assert [q["queue"] for q in cli_json(env, "queues")] == ["emails", "video"]


def test_a_running_supervisor_serves_the_limits_and_the_rejected_enqueues(
    dsn: str, env: dict[str, str], db: psycopg.Connection[Any], schema: str, forklift_cli: Any
) -> None:
    sup = forklift_cli(
        "run", "tests.apps.basic:app", "--workers", "1", "--queues", "default,emails"
    )
    wait_for(
        lambda: any("emails" in p["queues"] for p in cli_json(env, "ps")),
        interval=0.2,
        what="the supervisor registered",
    )
    said(env, "queues", "limit", "emails", "--concurrency", "3", "--rate", "120/60s",
         "--max-depth", "500")  # fmt: skip
    db.execute(f"UPDATE {schema}.limits SET rejected = 7 WHERE name = 'emails'")
    url = metrics_url(sup) + "/metrics"
    expected = [
        'forklift_queue_limit{kind="concurrency",queue="emails"} 3.0',
        'forklift_queue_limit{kind="rate_per_second",queue="emails"} 2.0',
        'forklift_queue_limit{kind="max_depth",queue="emails"} 500.0',
        'forklift_enqueue_rejected_total{queue="emails"} 7.0',
        'forklift_enqueue_rejected_total{queue="default"} 0.0',
    ]

    def served() -> str | None:
        text = get(url)[1]
        return text if all(e in text for e in expected) else None

    body = wait_for(served, timeout=10, interval=0.2, what="the limits in /metrics")
    assert 'queue="default"' not in "".join(
        line for line in str(body).splitlines() if line.startswith("forklift_queue_limit{")
    )
    said(env, "queues", "limit", "emails", "--rate", "none")
    expected = [e for e in expected if "rate_per_second" not in e]

    def rate_gone() -> bool:
        text = get(url)[1]
        return 'kind="rate_per_second"' not in text and all(e in text for e in expected)

    wait_for(rate_gone, timeout=10, interval=0.2, what="the rate gone from /metrics")
    app = forklift.App(dsn, schema=schema)  # the limited queue still gets its work done
    assert app.result(app.enqueue("noop", queue="emails"), timeout=20) is None
    app.close()
    sup.stop_cleanly(timeout=30)
