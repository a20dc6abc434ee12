"""`forklift workflows list|show|cancel`: where workflows stand, each one's graph, and
cancelling one.

Operator commands: they need only the database (--dsn, --schema), not the app.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from forklift._config import positive_int
from forklift.cli.apps import app_for, job_admin
from forklift.cli.errors import Exit, Refused
from forklift.cli.flags import operator_command
from forklift.shown import output, workflowview
from forklift.shown.workflowview import SHOWN, STEP_KEYS, WORKFLOW_KEYS

if TYPE_CHECKING:
    from rich.text import Text

    from forklift.admin import JobAdmin
    from forklift.app import App
    from forklift.store.workflows import WorkflowRow, WorkflowStore

LIMIT = 20

# How a state reads on a terminal: the colours `top` and the dashboard give states,
# in the terminal's own palette (readable on dark and light backgrounds).
STYLES = {
    "blocked": "yellow", "ready": "", "running": "bold blue", "succeeded": "green",
    "dead": "bold red", "cancelled": "dim",
}  # fmt: skip

GROUP_DESCRIPTION = """\
Operator commands on workflows (app.workflow, app.chain): graphs of jobs whose steps
run once the steps they come after succeeded. They need only the database (--dsn,
--schema), not the app. Each has --help with examples and --json for scripts (its
shape in its --help).
"""

GROUP_EXAMPLES = """\
examples:
  forklift workflows list --open
  forklift workflows show 12
  forklift workflows cancel 12
"""

LIST_DESCRIPTION = f"""\
List workflows, newest first (with --open, only those not finished), up to --limit:
each one's id, name, state, its steps by state and its age.

--json prints {{"workflows": [...]}}, each workflow an object with the keys
{WORKFLOW_KEYS}.
"""

LIST_EXAMPLES = """\
examples:
  forklift workflows list
  forklift workflows list --open --limit 5
  forklift workflows list --json | jq '.workflows[] | select(.dead > 0) | .id'
"""

SHOW_DESCRIPTION = f"""\
Show one workflow: its name, state, context (values of secret-looking keys hidden),
when it was created, cancelled (by whom) and finished, its steps by state, and its graph:
the steps by level (level 0: steps with no upstream step; a step's level is 1 + the
highest level of the steps it runs after), each with its name, job id, state, attempts,
the steps it runs after ("← a, b", "(ignores failure)" for those added with
ignore_failure=True), and what it waits for (a blocked step), why it was cancelled (a
cancelled step: which upstream step failed, or who cancelled it) or its last error (a
dead step). A workflow of more than {SHOWN} steps shows its first {SHOWN} by job id and
counts the others.

--json prints one object with the keys of a `workflows list` workflow,
{WORKFLOW_KEYS};
and context (the workflow's context, secrets hidden) and steps (every step, in job id
order, each an object with the keys
{STEP_KEYS}).
"""

SHOW_EXAMPLES = """\
examples:
  forklift workflows show 12
  forklift workflows show 12 --json | jq '.steps[] | select(.state == "dead") | .step'
"""

CANCEL_DESCRIPTION = """\
Cancel a workflow: mark it cancelled (by you, user@host) and cancel its blocked, ready
and running steps, as `forklift jobs cancel` does (a running step's worker is told to
stop and, if its handler does not return within `forklift run`'s --cancel-grace,
killed). Its steps that ended are kept as they are; once none is open the workflow
finishes with the outcome cancelled. It asks first on a terminal; --yes does not ask,
and without a terminal --yes is needed. Exit 1 if the workflow had finished already
(nothing is cancelled) or there is no such workflow.

--json prints one object: id, result (cancelled, already_cancelled: marked before, its
open steps cancelled now; finished: it had finished, nothing done), cancelled_blocked,
cancelled_ready, cancelled_running (steps cancelled), not_cancelled (steps that ended
before they could be), state (the workflow's after), cancelled_by.
"""

CANCEL_EXAMPLES = """\
examples:
  forklift workflows cancel 12
  forklift workflows cancel 12 --yes --json | jq '.cancelled_running'
"""

HEADER = (
    "id", "name", "state", "steps", "blocked", "ready", "running", "ok", "dead", "cancelled",
    "age",
)  # fmt: skip


def _stores(app: App) -> tuple[JobAdmin, WorkflowStore]:
    """The jobs (and their batch store, which cancels) and the workflows of `app`'s
    database, on one Connector: inside its session, one connection."""
    from forklift.store.workflows import WorkflowStore

    jobs = job_admin(app)
    return jobs, WorkflowStore(lambda: jobs.connector.conn("workflow query failed"), app.schema)


def _missing(workflow_id: int, schema: str) -> int:
    print(f"forklift: error: no workflow {workflow_id} in schema {schema}", file=sys.stderr)
    return Exit.ERROR


def _row(r: WorkflowRow) -> tuple[object, ...]:
    c = r.counts
    return (
        r.id, r.name or "-", r.state, workflowview.step_count(r), c.get("blocked", 0),
        c.get("ready", 0), c.get("running", 0), c.get("succeeded", 0), c.get("dead", 0),
        c.get("cancelled", 0), output.age(workflowview.age(r)),
    )  # fmt: skip


def cmd_list(args: argparse.Namespace) -> int:
    app = app_for(args)
    _, workflows = _stores(app)
    rows = workflows.recent(args.limit, open_only=args.open)
    if args.json:
        output.print_json({"workflows": [workflowview.workflow_json(r) for r in rows]})
        return Exit.OK
    output.table(HEADER, [_row(r) for r in rows], empty="no workflows")
    if len(rows) == args.limit:
        output.hint(f"more workflows than shown: --limit {args.limit * 2}")
    return Exit.OK


def cmd_show(args: argparse.Namespace) -> int:
    app = app_for(args)
    jobs, workflows = _stores(app)
    with jobs.connector.session("reading the workflow failed"):
        row = workflows.get(args.id)
        if row is None:
            return _missing(args.id, app.schema)
        steps = workflows.steps(args.id, limit=None if args.json else SHOWN)
    if args.json:
        output.print_json(workflowview.detail_json(row, steps))
        return Exit.OK
    _print_graph(workflowview.layout(row, steps))
    return Exit.OK


def _print_graph(shape: workflowview.Layout) -> None:
    """The header, then each level's steps, one a line, the state coloured (on a
    terminal: rich leaves a pipe's text plain, and honours NO_COLOR)."""
    from rich.console import Console

    console = Console(soft_wrap=True, highlight=False, markup=False, emoji=False)
    for line in workflowview.header_lines(shape.row):
        console.print(line)
    width = min(
        workflowview.NAME_CHARS, max((len(s.name) for c in shape.columns for s in c), default=1)
    )
    for level, column in enumerate(shape.columns):
        console.print(f"level {level}" + (" (no upstream step)" if level == 0 else ""))
        for step in column:
            console.print(_step_text(step, width))
    if shape.more:
        console.print(shape.more_text())


def _step_text(step: workflowview.StepLine, width: int) -> Text:
    from rich.text import Text

    head, state, tail = step.cells(width)
    text = Text("  " + head)
    text.append(state, style=STYLES.get(step.state, ""))
    text.append(tail)
    text.rstrip()
    return text


def cmd_cancel(args: argparse.Namespace) -> int:
    app = app_for(args)
    jobs, workflows = _stores(app)
    if not args.yes:
        _confirm(workflows, args.id)
    from forklift._ids import operator

    with jobs.connector.session("cancelling the workflow failed"):
        done = workflowview.cancel(workflows, jobs.batches, args.id, operator())
    if done is None:
        return _missing(args.id, app.schema)
    if args.json:
        output.print_json(workflowview.cancel_json(args.id, done))
    else:
        output.say(workflowview.cancel_text(args.id, done))
    return Exit.ERROR if done.refused else Exit.OK


def _confirm(workflows: WorkflowStore, workflow_id: int) -> None:
    """Ask on a terminal (stderr, stdin) before cancelling what is open; without one,
    refuse: --yes says it is meant. Nothing is asked of a workflow that is not there or
    has finished: the cancel says so."""
    row = workflows.get(workflow_id)
    if row is None or row.finished_at is not None:
        return
    if not sys.stdin.isatty():
        raise Refused(
            f"not cancelled: no terminal to ask on; pass --yes to cancel workflow {workflow_id}"
        )
    counts = row.counts
    question = (
        f"cancel workflow {workflow_id} ({row.name or 'no name'}): "
        f"{counts.get('blocked', 0)} blocked, {counts.get('ready', 0)} ready and "
        f"{counts.get('running', 0)} running steps? [y/N] "
    )
    print(output.cell(question, 400), end="", file=sys.stderr, flush=True)
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        raise Refused(f"not cancelled: workflow {workflow_id} is left as it is")


def register(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    common: list[argparse.ArgumentParser],
) -> None:
    group = sub.add_parser(
        "workflows",
        help="workflows: their steps by state, each one's graph; cancel one (operator; "
        "needs only the database)",
        description=GROUP_DESCRIPTION,
        epilog=GROUP_EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = group.add_subparsers(dest="action", metavar="ACTION", required=True)

    p = operator_command(
        actions, common, "list", "workflows, newest first, with their steps by state",
        LIST_DESCRIPTION, LIST_EXAMPLES,
    )  # fmt: skip
    p.add_argument("--open", action="store_true", help="only workflows not finished")
    p.add_argument(
        "--limit", type=positive_int, default=LIMIT,
        help=f"at most this many workflows (default: {LIMIT})",
    )  # fmt: skip
    p.set_defaults(func=cmd_list)

    p = operator_command(
        actions, common, "show", "one workflow: its steps by level, state, upstream steps",
        SHOW_DESCRIPTION, SHOW_EXAMPLES,
    )  # fmt: skip
    p.add_argument("id", type=int, metavar="ID", help="the workflow's id")
    p.set_defaults(func=cmd_show)

    p = operator_command(
        actions, common, "cancel", "cancel a workflow: its blocked, ready and running steps",
        CANCEL_DESCRIPTION, CANCEL_EXAMPLES,
    )  # fmt: skip
    p.add_argument("id", type=int, metavar="ID", help="the workflow's id")
    p.add_argument(
        "--yes", action="store_true", help="do not ask first (needed without a terminal)"
    )
    p.set_defaults(func=cmd_cancel)
