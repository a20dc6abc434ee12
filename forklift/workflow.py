"""Workflows: graphs of jobs whose steps run once the steps they come after succeeded.

`wf = app.workflow(name=...)`, `a = wf.add(task, args)`, `b = wf.add(task, args,
after=[a])`, `wf.enqueue()`: every job and every edge go in in one transaction (the
caller's, with `conn=`), by COPY. A step can only come after steps added before it, so a
graph cannot have a cycle. A step with upstream steps is `blocked`: no claim sees it
until the last of them succeeded (migration 0020 says how, exactly once). A dead or
cancelled upstream step cancels the steps that need it, unless they were added with
`ignore_failure=True`; retrying it (`forklift jobs retry`) brings them back.

A running step reads its upstream steps' results (`ctx.upstream`) and the workflow's
context (`ctx.workflow.context`), and may add steps to its own workflow
(`ctx.workflow.add`): they run after it, and its dependents wait for them too.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol, Unpack

from forklift import _json, _waiting
from forklift._job import JobOptions
from forklift.errors import ArgumentError
from forklift.store import Conn, NewJob, _steps
from forklift.store._boundary import translated
from forklift.store._steps import Steps
from forklift.store.batches import BatchStore, CancelledJob
from forklift.store.producing import ProducerLimits
from forklift.store.workflows import Node, WorkflowRow, WorkflowStore

# What enqueue refuses for a step: it runs when its upstream steps succeeded.
_NOT_FOR_STEPS = ("idempotency_key", "run_at", "delay")
# Build a job as App.enqueue would (the task's defaults and checks): App._new_job.
Build = Callable[..., NewJob]


class Named(Protocol):
    """A task as the workflow takes it: a forklift.Task, or its name."""

    @property
    def name(self) -> str: ...


class Producing(Protocol):
    """What a workflow needs of its App."""

    schema: str

    @property
    def store(self) -> Any: ...  # JobStore: its pool's connections

    def ends(self) -> _waiting.Ends: ...


class Step:
    """A step of a workflow being built: what `after=` takes. `id` is its job's id once
    the workflow is enqueued."""

    __slots__ = ("id", "index", "name", "workflow")

    def __init__(self, workflow: Workflow, name: str, index: int) -> None:
        self.workflow = workflow
        self.name = name
        self.index = index
        self.id: int | None = None

    def __repr__(self) -> str:
        return f"<forklift.Step {self.name!r}{'' if self.id is None else f' job {self.id}'}>"


# A link of app.chain(): a task (or its name), or a task and its arguments.
Link = Named | str | tuple[Named | str, Mapping[str, Any]]


def task_name(task: Named | str) -> str:
    if isinstance(task, str):
        return task
    name = getattr(task, "name", None)
    if not isinstance(name, str):
        raise ArgumentError(f"a step's task is one @app.task made, or its name; got {task!r}")
    return name


def step_options(options: Mapping[str, Any]) -> None:
    """Refuse the enqueue options that do not apply to a step."""
    given = [k for k in _NOT_FOR_STEPS if options.get(k) is not None]
    if given:
        raise ArgumentError(
            f"a workflow step runs once its upstream steps succeeded: {', '.join(given)} "
            "cannot be given for one"
        )
    if options.get("unique") or options.get("on_conflict") is not None:
        raise ArgumentError(
            "a workflow step is never unique (forklift.Unique): it is its workflow's, "
            "and a live job holding its key would not be; unique= and on_conflict= "
            "cannot be given for one (a task declared unique runs as a plain step)"
        )


def unique_name(wanted: str, taken: Callable[[str], bool], tried: dict[str, int]) -> str:
    """`wanted`, or `wanted#2`, `wanted#3`, ...: the first not `taken`. `tried` keeps the
    last number tried for each name, so 10,000 steps of one task are named in linear
    time, not quadratic."""
    n = tried.get(wanted, 1)
    name = wanted if n == 1 else f"{wanted}#{n}"
    while taken(name):
        n += 1
        name = f"{wanted}#{n}"
    tried[wanted] = n
    return name


class Workflow:
    """A graph of jobs to insert at once; see the module's docstring."""

    def __init__(
        self,
        app: Producing,
        build: Build,
        name: str = "",
        context: Mapping[str, Any] | None = None,
    ) -> None:
        self._app = app
        self._build = build
        self.name = checked_name(name, "a workflow's name") if name else ""
        self.context = dict(context or {})
        _json.dumps_args(self.context, _json.MAX_ARG_BYTES)  # JSON, or ArgumentError now
        self.id: int | None = None
        self._nodes: list[Node] = []
        self._steps: list[Step] = []
        self._names: set[str] = set()
        self._tried: dict[str, int] = {}  # unique_name's

    def __repr__(self) -> str:
        return f"<forklift.Workflow {self.name!r} {len(self._steps)} steps id={self.id}>"

    @property
    def steps(self) -> list[Step]:
        return list(self._steps)

    def add(
        self,
        task: Named | str,
        args: Mapping[str, Any] | None = None,
        *,
        after: Iterable[Step] = (),
        ignore_failure: bool = False,
        name: str | None = None,
        **options: Unpack[JobOptions],
    ) -> Step:
        """A step running `task` with `args` once every step in `after` succeeded (or,
        with `ignore_failure`, ended whichever way: its handler sees how in
        ctx.upstream). `name`: its name in the workflow (default the task's name, then
        `name#2`, ...), how ctx.upstream and `forklift workflows show` call it. Options
        as enqueue's, but for idempotency_key, run_at and delay."""
        if self.id is not None:
            raise ArgumentError("this workflow was enqueued already: build a new one")
        step_options(options)
        upstream = self._upstream(after)
        job = self._build(task_name(task), args, **options)
        wanted = task_name(task) if name is None else checked_name(name)
        if name is not None and wanted in self._names:
            raise ArgumentError(f"workflow {self.name!r} has a step named {wanted!r} already")
        named = unique_name(wanted, self._names.__contains__, self._tried)
        step = Step(self, named, len(self._steps))
        self._names.add(step.name)
        self._nodes.append(Node(step.name, job, upstream, ignore_failure))
        self._steps.append(step)
        return step

    def _upstream(self, after: Iterable[Step]) -> tuple[int, ...]:
        places: dict[int, None] = {}  # in the order given, each once
        for step in after:
            if not isinstance(step, Step):
                raise ArgumentError(f"after= takes the steps wf.add() returned, got {step!r}")
            if step.workflow is not self:
                raise ArgumentError(
                    f"step {step.name!r} belongs to another workflow: a step runs only after "
                    "steps of its own"
                )
            places[step.index] = None
        return tuple(places)

    def enqueue(self, *, conn: Conn | None = None) -> int:
        """Insert every step and edge in one transaction (`conn`'s, if given: they commit
        with it); the workflow's id. Each Step's `id` is set."""
        if self.id is not None:
            raise ArgumentError(f"workflow {self.id} was enqueued already")
        if not self._nodes:
            raise ArgumentError("a workflow needs at least one step: wf.add(task, args)")
        jobs, store = self._app.store, self._store()
        with contextlib.ExitStack() as stack:
            if conn is None:
                conn = stack.enter_context(jobs.pool.connection())
                stack.enter_context(conn.transaction())
            with translated("enqueueing the workflow failed"):
                _steps.run(_prepared(jobs.producing, self._nodes), conn, jobs.pool.connection)
            workflow_id, ids = store.insert(self.name, self.context, self._nodes, conn)
        for step, job_id in zip(self._steps, ids, strict=True):
            step.id = job_id
        self.id = workflow_id
        return workflow_id

    def status(self) -> WorkflowRow:
        """Where it stands: its row, with its jobs counted by state."""
        row = self._store().get(self._enqueued())
        if row is None:
            raise ArgumentError(f"no workflow {self.id} (pruned)")
        return row

    def wait(self, timeout: float = 60.0) -> WorkflowRow:
        """Its status once it finished (no job of it blocked, ready or running), waiting
        up to `timeout` seconds; TimeoutError if it did not finish by then."""
        workflow_id = self._enqueued()

        def finished() -> WorkflowRow | None:
            row = self.status()
            return row if row.finished_at is not None else None

        ends = self._app.ends()
        found = _waiting.wait_for_end(ends, self._app.schema, f"w{workflow_id}", finished, timeout)
        if found is None:
            raise TimeoutError(f"workflow {workflow_id} did not finish within {timeout:g} s")
        return found

    def _enqueued(self) -> int:
        if self.id is None:
            raise ArgumentError("this workflow is not enqueued yet: wf.enqueue()")
        return self.id

    def _store(self) -> WorkflowStore:
        return WorkflowStore(self._app.store.pool.connection, self._app.schema)


def _prepared(producing: ProducerLimits, nodes: Sequence[Node]) -> Steps[None]:
    """Give the steps their limit keys as an enqueue does, and refuse (QueueFull) steps
    that would be ready at once past their queue's max_depth (a blocked step is not in
    the queue's depth until it is released)."""
    yield from producing.refresh()
    for node in nodes:
        producing.key(node.job)
    yield from producing.check_depth([n.job for n in nodes if not n.after])


def checked_name(name: str, what: str = "a step's name") -> str:
    if not isinstance(name, str) or not name or len(name) > 200 or not name.isprintable():
        raise ArgumentError(f"{what} is printable text of 1 to 200 characters, got {name!r}")
    return name


def chain(app: Producing, build: Build, links: Sequence[Link]) -> Workflow:
    """A workflow whose steps run one after another (app.chain), not yet enqueued."""
    if not links:
        raise ArgumentError("app.chain() needs at least one step")
    first = links[0][0] if isinstance(links[0], tuple) else links[0]
    wf = Workflow(app, build, name=f"chain of {task_name(first)}")
    previous: list[Step] = []
    for link in links:
        task, args = link if isinstance(link, tuple) else (link, None)
        previous = [wf.add(task, args, after=previous)]
    return wf


def cancel(
    workflows: WorkflowStore, batches: BatchStore, workflow_id: int, by: str
) -> tuple[bool, list[CancelledJob]]:
    """Cancel workflow `workflow_id`: mark it (False: finished or cancelled already),
    cancel its blocked and ready jobs, and its running ones as `forklift jobs cancel`
    does (their handlers see ctx.cancelled)."""
    marked = workflows.mark_cancelled(workflow_id, by)
    jobs = batches.job_cancel_many(workflows.open_job_ids(workflow_id), by)
    return marked, jobs
