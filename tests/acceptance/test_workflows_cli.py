"""`forklift workflows list|show|cancel` through the real CLI against a real schema:
workflows made by app.workflow, their steps' states set in SQL as workers would set them
(no supervisor; migration 0020's triggers release and cancel dependents as they would),
hostile names shown escaped, the graph laid out by level, bounded at 200 steps, and a
cancel that asks first, says what it cancelled, and leaves a finished workflow alone."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import psycopg

import forklift
from forklift.store.workflows import WorkflowStore
from tests.acceptance.conftest import cli, cli_json
from tests.acceptance.test_batches_cli import ESCAPED, HOSTILE, clean
from tests.acceptance.test_operator_cli import documented

WORKFLOW_KEYS = {
    "id", "name", "state", "outcome", "total", "step_count", "blocked", "ready", "running",
    "succeeded", "dead", "cancelled", "created_at", "cancelled_at", "finished_at",
    "cancelled_by", "age_seconds",
}  # fmt: skip
SHOW_KEYS = WORKFLOW_KEYS | {"context", "steps"}
STEP_KEYS = {
    "id", "step", "task", "queue", "state", "attempts", "level", "waiting_on", "after",
    "ignoring", "upstream_failed", "last_error", "created_at", "started_at", "completed_at",
}  # fmt: skip
CANCEL_KEYS = {
    "id", "result", "cancelled_blocked", "cancelled_ready", "cancelled_running",
    "not_cancelled", "state", "cancelled_by",
}  # fmt: skip
# The hostile step name as a line shows it: escaped, cut to 40 characters.
TRAIN = f"train{ESCAPED}"[:39] + "…"
SGR = re.compile(r"\x1b\[[0-9;]*m")


@dataclass(frozen=True)
class Made:
    """A running workflow of 6 steps (ids by step name) and a finished one of 2."""

    open_id: int
    ids: dict[str, int]
    finished_id: int


def set_step(db: psycopg.Connection[Any], schema: str, job_id: int, sets: str, *p: Any) -> None:
    db.execute(f"UPDATE {schema}.jobs SET {sets} WHERE id = %s", (*p, job_id))


def make_workflows(app: forklift.App, db: psycopg.Connection[Any], schema: str) -> Made:
    """extract → train, validate; report after both (ignoring their failure), publish
    after report, audit after validate; the workflow's name and train's hostile, written
    in SQL (the builder refuses them). extract succeeded, train runs, validate went dead
    (so audit was cancelled, and report waits for train only). Then a finished chain."""
    wf = app.workflow(name="nightly", context={"day": "2026-12-07", "api_key": "sekret-1"})
    extract = wf.add("extract", {}, name="extract")
    train = wf.add("train", {}, after=[extract], name="train")
    validate = wf.add("validate", {}, after=[extract], name="validate")
    report = wf.add("report", {}, after=[train, validate], ignore_failure=True, name="report")
    wf.add("publish", {}, after=[report], name="publish")
    wf.add("audit", {}, after=[validate], name="audit")
    open_id = wf.enqueue()
    ids = {s.name: s.id for s in wf.steps if s.id is not None}
    db.execute(f"UPDATE {schema}.workflows SET name = %s WHERE id = %s", (HOSTILE, open_id))
    set_step(db, schema, ids["train"], "step = %s", f"train{HOSTILE}")
    set_step(db, schema, ids["extract"], "state = 'succeeded', attempts = 1, completed_at = now()")
    set_step(
        db, schema, ids["train"],
        "state = 'running', attempts = 1, started_at = now(), lease_owner = 'h:1:w',"
        " lease_until = now() + interval '1 hour'",
    )  # fmt: skip
    set_step(
        db, schema, ids["validate"],
        "state = 'dead', attempts = 3, completed_at = now(), last_error = %s", HOSTILE,
    )  # fmt: skip
    chain = app.chain("extract", "publish")
    finished_id = chain.enqueue()
    for step in chain.steps:
        assert step.id is not None
        set_step(db, schema, step.id, "state = 'succeeded', attempts = 1, completed_at = now()")
    return Made(open_id, ids, finished_id)


def test_workflows_list_show_and_cancel(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    app = forklift.App(dsn, schema=schema)
    made = make_workflows(app, db, schema)
    check_list(env, made)
    check_show_json(env, made)
    check_show_text(env, made)
    check_cancel(env, db, schema, made)
    app.close()


def check_list(env: dict[str, str], made: Made) -> None:
    listed = cli_json(env, "workflows", "list")["workflows"]
    assert [w["id"] for w in listed] == [made.finished_id, made.open_id]  # newest first
    assert all(set(w) == WORKFLOW_KEYS for w in listed)
    documented(WORKFLOW_KEYS | {"workflows"}, "workflows", "list")
    done, running = listed
    assert (done["state"], done["outcome"], done["succeeded"]) == ("succeeded", "succeeded", 2)
    assert done["finished_at"] is not None and done["name"] == "chain of extract"
    counts = [running[s] for s in ("blocked", "ready", "running", "succeeded", "dead", "cancelled")]
    assert counts == [2, 0, 1, 1, 1, 1]
    assert (running["state"], running["outcome"], running["name"]) == ("running", None, HOSTILE)
    assert (running["total"], running["step_count"]) == (6, 6)
    opened = cli_json(env, "workflows", "list", "--open")["workflows"]
    assert [w["id"] for w in opened] == [made.open_id]

    table = cli(env, "workflows", "list")
    assert table.returncode == 0, table.stderr
    clean(table.stdout)
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        "id", "name", "state", "steps", "blocked", "ready", "running", "ok", "dead",
        "cancelled", "age",
    ]  # fmt: skip
    assert lines[1].split()[:4] == [str(made.finished_id), "chain", "of", "extract"]
    assert lines[2].split()[0] == str(made.open_id) and ESCAPED[:40] in lines[2]
    assert lines[2].split()[-9:-1] == ["running", "6", "2", "0", "1", "1", "1", "1"]
    short = cli(env, "workflows", "list", "--limit", "1")
    assert len(short.stdout.splitlines()) == 2 and "--limit 2" in short.stderr


def check_show_json(env: dict[str, str], made: Made) -> None:
    shown = cli_json(env, "workflows", "show", str(made.open_id))
    assert set(shown) == SHOW_KEYS
    documented(SHOW_KEYS | STEP_KEYS, "workflows", "show")
    assert shown["context"] == {"day": "2026-12-07", "api_key": "***"}
    steps = {s["task"]: s for s in shown["steps"]}
    assert [s["id"] for s in shown["steps"]] == sorted(made.ids.values())
    assert all(set(s) == STEP_KEYS for s in shown["steps"])
    ids = made.ids
    levels = {task: s["level"] for task, s in steps.items()}
    assert levels == {
        "extract": 0, "train": 1, "validate": 1, "report": 2, "audit": 2, "publish": 3
    }  # fmt: skip
    assert steps["train"]["step"] == f"train{HOSTILE}" and steps["train"]["state"] == "running"
    report = steps["report"]
    assert report["after"] == report["ignoring"] == [ids["train"], ids["validate"]]
    assert (report["state"], report["waiting_on"]) == ("blocked", 1)
    audit = steps["audit"]
    assert (audit["state"], audit["upstream_failed"]) == ("cancelled", ids["validate"])
    assert audit["after"] == [ids["validate"]] and audit["ignoring"] == []
    assert steps["validate"]["last_error"] == HOSTILE


def check_show_text(env: dict[str, str], made: Made) -> None:
    result = cli(env, "workflows", "show", str(made.open_id))
    assert result.returncode == 0, result.stderr
    clean(result.stdout)
    lines = result.stdout.splitlines()
    ids = made.ids
    assert lines[0] == f"workflow {made.open_id}: {ESCAPED}, running"
    assert lines[1] == (
        "  steps        6 made; by state: 2 blocked, 0 ready, 1 running, 1 succeeded, "
        "1 dead, 1 cancelled"
    )
    assert lines[2] == '  context      {"day": "2026-12-07", "api_key": "***"}'
    assert "sekret" not in result.stdout
    graph = [re.sub(r" {2,}", " | ", line.strip()) for line in lines[6:]]
    assert graph == [
        "level 0 (no upstream step)",
        f"extract | job {ids['extract']} | succeeded | attempts 1",
        "level 1",
        f"{TRAIN} | job {ids['train']} | running | attempts 1 | ← extract",
        f"validate | job {ids['validate']} | dead | attempts 3 | ← extract | last error: {ESCAPED}",
        "level 2",
        f"report | job {ids['report']} | blocked | attempts 0 | ← {TRAIN} (ignores failure), "
        f"validate (ignores failure) | waits for {TRAIN}",
        f"audit | job {ids['audit']} | cancelled | attempts 0 | ← validate | "
        f"Cancelled: upstream job {ids['validate']} (validate) dead",
        "level 3",
        f"publish | job {ids['publish']} | blocked | attempts 0 | ← report | waits for report",
    ]


def check_cancel(env: dict[str, str], db: psycopg.Connection[Any], schema: str, made: Made) -> None:
    def states() -> dict[str, str]:
        rows = db.execute(
            f"SELECT id, state::text FROM {schema}.jobs WHERE workflow_id = %s", (made.open_id,)
        ).fetchall()
        by_id = dict(rows)
        return {name: by_id[i] for name, i in made.ids.items()}

    before = states()
    asked = subprocess.run(
        [sys.executable, "-m", "forklift", "workflows", "cancel", str(made.open_id)],
        env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert asked.returncode == 1 and asked.stdout == ""
    assert "no terminal to ask on; pass --yes" in asked.stderr
    assert states() == before  # nothing was cancelled

    cancelled = cli_json(env, "workflows", "cancel", str(made.open_id), "--yes")
    assert set(cancelled) == CANCEL_KEYS
    documented(CANCEL_KEYS, "workflows", "cancel")
    counts = [cancelled[f"cancelled_{s}"] for s in ("blocked", "ready", "running")]
    assert counts == [2, 0, 1] and cancelled["not_cancelled"] == 0
    assert (cancelled["result"], cancelled["state"]) == ("cancelled", "cancelled")
    assert cancelled["cancelled_by"]
    assert states() == {
        "extract": "succeeded", "train": "cancelled", "validate": "dead",
        "report": "cancelled", "publish": "cancelled", "audit": "cancelled",
    }  # fmt: skip
    again = cli(env, "workflows", "cancel", str(made.open_id), "--yes")
    assert again.returncode == 1, again.stderr
    assert again.stdout.startswith(
        f"workflow {made.open_id}: not cancelled: it finished already (cancelled, "
    )
    refused = cli(env, "workflows", "cancel", str(made.finished_id))  # no --yes: nothing to ask
    assert refused.returncode == 1 and "it finished already (succeeded, " in refused.stdout
    for command in (("show",), ("cancel", "--yes")):
        missing = cli(env, "workflows", command[0], "424242", *command[1:])
        assert missing.returncode == 1 and missing.stdout == ""
        assert missing.stderr.strip() == f"forklift: error: no workflow 424242 in schema {schema}"


def test_workflows_cancel_says_what_it_cancelled(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """The text of a cancel: by whom, how many blocked, ready and running steps."""
    app = forklift.App(dsn, schema=schema)
    wf = app.workflow(name="nightly")
    first = wf.add("extract", {})
    wf.add("train", {}, after=[first])
    workflow_id = wf.enqueue()
    text = cli(env, "workflows", "cancel", str(workflow_id), "--yes")
    assert text.returncode == 0, text.stderr
    assert re.fullmatch(
        rf"workflow {workflow_id}: cancelled by \S+@\S+; 1 blocked, 1 ready and 0 running "
        r"steps cancelled; it is cancelled now\n",
        text.stdout,
    ), text.stdout
    app.close()


def test_workflows_show_bounds_a_big_workflow_and_lays_out_grown_steps(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """230 steps: the first 200 by job id laid out, the rest counted (with every step's
    state counted right); --json has all 230. A step grown at run time (ctx.workflow.add:
    a larger job id than the dependents it is grafted in before) is laid out by its edges,
    not its id: the dependent comes at a level after it."""
    app = forklift.App(dsn, schema=schema)
    wf = app.workflow(name="wide")
    root = wf.add("extract", {}, name="root")
    leaves = [wf.add("train", {}, after=[root], name=f"leaf{i}") for i in range(228)]
    wf.add("publish", {}, after=leaves[:3], name="sink")
    workflow_id = wf.enqueue()
    assert root.id is not None
    set_step(
        db, schema, root.id,
        "state = 'running', attempts = 1, started_at = now(), lease_owner = 'h:1:w',"
        " lease_until = now() + interval '1 hour'",
    )  # fmt: skip
    store = WorkflowStore(app.store.pool.connection, schema)
    with app.store.pool.connection() as conn:
        grown = store.grow(root.id, "h:1:w", 1, "late", app._new_job("extract", {}), [], conn)
    assert grown is not None and grown > max(s.id or 0 for s in wf.steps)

    text = cli(env, "workflows", "show", str(workflow_id))
    assert text.returncode == 0, text.stderr
    steps = [line for line in text.stdout.splitlines() if re.search(r"  job \d+ ", line)]
    assert len(steps) == 200
    assert text.stdout.splitlines()[-1] == (
        "… and 31 more steps not shown (the first 200 by job id are); all 231 by state: "
        "230 blocked, 0 ready, 1 running, 0 succeeded, 0 dead, 0 cancelled"
    )
    full = cli_json(env, "workflows", "show", str(workflow_id))
    assert len(full["steps"]) == 231 and full["total"] == 231
    level = {s["step"]: s["level"] for s in full["steps"]}
    assert (level["root"], level["late"], level["leaf0"], level["sink"]) == (0, 1, 2, 3)
    app.close()


def test_workflows_show_colours_states_on_a_terminal_and_still_escapes_names(
    env: dict[str, str], dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """With colour forced (as on a terminal), each state has its colour, and nothing but
    those colour codes reaches the terminal: the hostile names are still escaped."""
    app = forklift.App(dsn, schema=schema)
    made = make_workflows(app, db, schema)
    coloured = {k: v for k, v in env.items() if k != "NO_COLOR"}
    coloured.update(FORCE_COLOR="1", TERM="xterm-256color", COLUMNS="200")
    result = cli(coloured, "workflows", "show", str(made.open_id))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "\x1b[1;31mdead" in out and "\x1b[33mblocked" in out  # red, yellow
    assert "\x1b[32msucceeded" in out and "\x1b[1;34mrunning" in out  # green, blue
    assert "\x1b[2mcancelled" in out  # dim
    plain = SGR.sub("", out)
    clean(plain)
    uncoloured = cli(env, "workflows", "show", str(made.open_id)).stdout.splitlines()
    graph = slice(6, None)  # the header's "(1s ago)" may tick between the two
    assert plain.splitlines()[graph] == uncoloured[graph] and len(uncoloured) == 16
    app.close()
