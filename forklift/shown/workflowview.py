"""How a workflow reads: its steps laid out by level and counted by state, each step as
one line (name, job, state, attempts, its upstream steps, what it waits for or why it
ended), the `--json` shapes, and what cancelling it did; `forklift workflows` and the
dashboard's workflow pages both lay a workflow out from here."""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from forklift import _display
from forklift.shown import jobview, output

if TYPE_CHECKING:
    from forklift.store.batches import BatchStore, CancelledJob
    from forklift.store.workflows import StepRow, WorkflowRow, WorkflowStore

# A workflow job's states, in the order a step goes through them.
STATES = ("blocked", "ready", "running", "succeeded", "dead", "cancelled")
ENDED = frozenset({"succeeded", "dead", "cancelled"})
SHOWN = 200  # steps laid out (terminal and graph); the others are counted by state
NAME_CHARS = 40  # of a step's name in its line
UPSTREAM_NAMED = 8  # upstream steps named in a step's line; the others are counted
NOTE_CHARS = 160  # of what a step waits for, or why it was cancelled or died

WORKFLOW_KEYS = """\
id, name, state (running, cancelling: cancelled, its running steps stopping; or once
finished its outcome: succeeded, failed: a step went dead or was cancelled, cancelled),
outcome (null until finished), total (steps made, those added by running steps
included), step_count (its steps now), blocked, ready, running, succeeded, dead, cancelled
(its steps by state), created_at, cancelled_at, finished_at (ISO 8601 UTC, or null),
cancelled_by (user@host, or null), age_seconds"""

STEP_KEYS = """\
id (its job's id), step (its name in the workflow), task, queue, state (blocked,
ready, running, succeeded, dead, cancelled), attempts, level (0: no upstream step, else
1 + the highest level of its upstream steps), waiting_on (upstream steps it still waits
for), after (its upstream steps' job ids), ignoring (those of them whose failure it
does not mind: ignore_failure), upstream_failed (the upstream job whose failure
cancelled it, or null), last_error, created_at, started_at, completed_at"""


def label(step: StepRow) -> str:
    """A step's name as people read it (its task's for a job stored without one)."""
    return _display.line(step.step if step.step is not None else step.task)


def levels(steps: Sequence[StepRow]) -> dict[int, int]:
    """Each step's level by job id: 0 for a step with no upstream step among `steps`,
    else 1 + the highest level of its upstream steps. An upstream job not among them
    (past the first SHOWN, or pruned) does not count. Steps on a cycle, which no builder
    can make, keep the level they reached instead of hanging the view."""
    known = {s.id for s in steps}
    below: dict[int, list[int]] = {s.id: [] for s in steps}
    waiting = {s.id: 0 for s in steps}
    for s in steps:
        for up in set(s.after) & known:
            below[up].append(s.id)
            waiting[s.id] += 1
    level = dict.fromkeys(waiting, 0)
    todo = deque(i for i in sorted(waiting) if waiting[i] == 0)
    while todo:
        up = todo.popleft()
        for down in below[up]:
            level[down] = max(level[down], level[up] + 1)
            waiting[down] -= 1
            if waiting[down] == 0:
                todo.append(down)
    return level


def counts_text(counts: Mapping[str, int]) -> str:
    """Steps by state: `2 blocked, 1 ready, 0 running, 3 succeeded, 0 dead, 0 cancelled`."""
    return ", ".join(f"{counts.get(state, 0)} {state}" for state in STATES)


def step_count(row: WorkflowRow) -> int:
    """The workflow's steps now (those its jobs' retention pruned are not)."""
    return sum(row.counts.values())


@dataclass(frozen=True)
class StepLine:
    """One step as a line: its name (escaped), job, state, attempts, level, its upstream
    steps (`← a, b (ignores failure)`) and a note: what it waits for, or why it was
    cancelled or died (escaped, bounded)."""

    id: int
    name: str
    state: str
    attempts: int
    level: int
    upstream: str
    note: str
    after: tuple[int, ...]  # its upstream jobs' ids
    ignoring: frozenset[int]  # those of them whose failure it does not mind

    def cells(self, width: int = NAME_CHARS) -> tuple[str, str, str]:
        """The line for a terminal in three parts, the state alone in the middle (to
        colour it): name padded to `width`, job id; the state; attempts, upstream, note."""
        head = f"{output.cell(self.name, width):<{width}}  job {self.id:<8}  "
        tail = f"  attempts {self.attempts}"
        if self.upstream:
            tail += f"  {self.upstream}"
        if self.note:
            tail += f"  {self.note}"
        return head, f"{self.state:<9}", tail

    def text(self) -> str:
        """The line unpadded: `train, job 12, running, attempts 1, ← extract`."""
        parts = [self.name, f"job {self.id}", self.state, f"attempts {self.attempts}"]
        return ", ".join(parts + [p for p in (self.upstream, self.note) if p])


def _upstream(step: StepRow, names: Mapping[int, str]) -> str:
    if not step.after:
        return ""
    ignoring = set(step.ignoring)
    shown = [
        output.cell(names.get(up, f"job {up}"), NAME_CHARS)
        + (" (ignores failure)" if up in ignoring else "")
        for up in step.after[:UPSTREAM_NAMED]
    ]
    more = len(step.after) - len(shown)
    return "← " + ", ".join(shown) + (f", +{more} more" if more > 0 else "")


def _note(step: StepRow, by_id: Mapping[int, StepRow]) -> str:
    if step.state == "blocked":
        return _waits_for(step, by_id)
    if step.state in ("cancelled", "dead") and step.last_error:
        prefix = "" if step.state == "cancelled" else "last error: "
        return output.clip(prefix + step.last_error, NOTE_CHARS)
    return ""


def _waits_for(step: StepRow, by_id: Mapping[int, StepRow]) -> str:
    """The upstream steps a blocked step still waits for: those that have not succeeded
    (over an edge that ignores failure: not ended), by name when they are known."""
    ignoring = set(step.ignoring)
    open_ = [
        by_id[up]
        for up in step.after
        if up in by_id
        and not (by_id[up].state == "succeeded" or (up in ignoring and by_id[up].state in ENDED))
    ]
    named = [output.cell(label(u), NAME_CHARS) for u in open_[:UPSTREAM_NAMED]]
    more = max(step.waiting_on, len(open_)) - len(named)
    if not named:
        return f"waits for {output.plural(step.waiting_on, 'upstream step')}"
    return "waits for " + ", ".join(named) + (f", +{more} more" if more > 0 else "")


@dataclass(frozen=True)
class Layout:
    """A workflow laid out: its first SHOWN steps (in id order) as lines in columns by
    level (each column in id order), and how many of its steps are not laid out."""

    row: WorkflowRow
    columns: list[list[StepLine]]
    shown: int
    steps: int  # the workflow's steps now: laid out or not

    @property
    def more(self) -> int:
        return max(0, self.steps - self.shown)

    def more_text(self) -> str:
        """The line that says what is not laid out ('' when every step is)."""
        if not self.more:
            return ""
        return (
            f"… and {self.more} more {'step' if self.more == 1 else 'steps'} not shown "
            f"(the first {self.shown} by job id are); all {self.steps} by state: "
            f"{counts_text(self.row.counts)}"
        )


def layout(row: WorkflowRow, steps: Sequence[StepRow], limit: int = SHOWN) -> Layout:
    """`row`'s steps `steps` (in id order; the first `limit` are laid out) by level."""
    first = list(steps[:limit])
    by_id = {s.id: s for s in first}
    names = {s.id: label(s) for s in first}
    level = levels(first)
    columns: list[list[StepLine]] = [[] for _ in range(max(level.values(), default=-1) + 1)]
    for s in first:
        line = StepLine(
            s.id, names[s.id], s.state, s.attempts, level[s.id], _upstream(s, names),
            _note(s, by_id), tuple(s.after), frozenset(s.ignoring),
        )  # fmt: skip
        columns[line.level].append(line)
    return Layout(row, columns, len(first), max(step_count(row), len(first)))


def header_lines(row: WorkflowRow) -> list[str]:
    """`workflows show`'s head for people, one field a line, every value escaped."""
    now = row.now
    cancelled = output.when(row.cancelled_at, now)
    if row.cancelled_by:
        cancelled += f" by {_display.line(row.cancelled_by)}"
    return [
        f"workflow {row.id}: {_display.line(row.name) or '(no name)'}, {row.state}",
        f"  steps        {row.total} made; by state: {counts_text(row.counts)}",
        f"  context      {_display.line(context_text(row))}",
        f"  created      {output.when(row.created_at, now)}",
        f"  cancelled    {cancelled}",
        f"  finished     {output.when(row.finished_at, now)}",
    ]


def context_text(row: WorkflowRow, limit: int = NOTE_CHARS) -> str:
    """Its context as JSON text, values of secret-looking keys hidden, cut to `limit`."""
    return jobview.safe_args(row.context, limit)[0]


def age(row: WorkflowRow) -> float:
    return max(0.0, (row.now - row.created_at).total_seconds())


def workflow_json(row: WorkflowRow) -> dict[str, Any]:
    """One workflow in the `--json` shape of `workflows list` (the head of `show`'s)."""
    return {
        "id": row.id, "name": row.name, "state": row.state, "outcome": row.outcome,
        "total": row.total, "step_count": step_count(row),
        **{state: row.counts.get(state, 0) for state in STATES},
        "created_at": output.utc(row.created_at), "cancelled_at": output.utc(row.cancelled_at),
        "finished_at": output.utc(row.finished_at), "cancelled_by": row.cancelled_by,
        "age_seconds": age(row),
    }  # fmt: skip


def step_json(s: StepRow, level: int) -> dict[str, Any]:
    """One step in the `--json` shape of `workflows show`."""
    return {
        "id": s.id, "step": s.step, "task": s.task, "queue": s.queue, "state": s.state,
        "attempts": s.attempts, "level": level, "waiting_on": s.waiting_on,
        "after": list(s.after), "ignoring": list(s.ignoring),
        "upstream_failed": s.upstream_failed, "last_error": s.last_error,
        "created_at": output.utc(s.created_at), "started_at": output.utc(s.started_at),
        "completed_at": output.utc(s.completed_at),
    }  # fmt: skip


def detail_json(row: WorkflowRow, steps: Sequence[StepRow]) -> dict[str, Any]:
    """One workflow and every step of it: the `--json` shape of `workflows show`."""
    level = levels(steps)
    return {
        **workflow_json(row),
        "context": jobview.safe_result(row.context),
        "steps": [step_json(s, level[s.id]) for s in steps],
    }


@dataclass(frozen=True)
class Cancelled:
    """What cancelling a workflow did: `refused` when it had finished (nothing was done);
    else whether this call marked it cancelled (False: it was marked before), the jobs
    it cancelled, and the workflow as it is after."""

    refused: bool
    marked: bool
    jobs: list[CancelledJob]
    after: WorkflowRow

    def cancelled(self, was: str) -> int:
        return sum(1 for j in self.jobs if j.done and j.was == was)


def cancel(
    workflows: WorkflowStore, batches: BatchStore, workflow_id: int, by: str
) -> Cancelled | None:
    """Cancel the workflow (forklift.workflow.cancel) unless it finished; None: there is
    no such workflow."""
    from forklift.workflow import cancel as cancel_workflow

    before = workflows.get(workflow_id)
    if before is None:
        return None
    if before.finished_at is not None:
        return Cancelled(True, False, [], before)
    marked, jobs = cancel_workflow(workflows, batches, workflow_id, by)
    after = workflows.get(workflow_id) or before
    # Not marked, and no one's mark: it finished between the two reads.
    return Cancelled(not marked and after.cancelled_at is None, marked, jobs, after)


def cancel_json(workflow_id: int, done: Cancelled) -> dict[str, Any]:
    result = "finished" if done.refused else "cancelled" if done.marked else "already_cancelled"
    return {
        "id": workflow_id, "result": result,
        **{f"cancelled_{was}": done.cancelled(was) for was in ("blocked", "ready", "running")},
        "not_cancelled": sum(1 for j in done.jobs if not j.done),
        "state": done.after.state, "cancelled_by": done.after.cancelled_by,
    }  # fmt: skip


def cancel_text(workflow_id: int, done: Cancelled) -> str:
    row = done.after
    if done.refused:
        return (
            f"workflow {workflow_id}: not cancelled: it finished already ({row.outcome}, "
            f"{output.when(row.finished_at, row.now)}); nothing was cancelled"
        )
    head = f"workflow {workflow_id}: cancelled by {row.cancelled_by}"
    if not done.marked:
        head = f"workflow {workflow_id}: was cancelled already by {row.cancelled_by}"
    counts = [done.cancelled(was) for was in ("blocked", "ready", "running")]
    steps = "step" if sum(counts) == 1 else "steps"
    text = (
        f"{head}; {counts[0]} blocked, {counts[1]} ready and {counts[2]} running {steps} cancelled"
    )
    if counts[2]:
        text += (
            " (its worker is told to stop)"
            if counts[2] == 1
            else " (their workers are told to stop)"
        )
    if late := sum(1 for j in done.jobs if not j.done):
        text += f"; {late} ended before {'it' if late == 1 else 'they'} could be"
    return text + f"; it is {row.state} now"
