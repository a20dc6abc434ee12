"""What a workflow step's handler reads and does in its workflow: `ctx.upstream`, the
results of the jobs it ran after, and `ctx.workflow`, the workflow's context and a way
to add steps to it (forklift/workflow.py says what a workflow is).

Both are read once per attempt, on first use, in the handler's effect transaction if
one is open (else on an effects connection); a job of no workflow reads nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

import psycopg

from forklift import _job, _json
from forklift.errors import ArgumentError, LeaseLost, UpstreamFailed
from forklift.store import JobStore, NewJob
from forklift.store.workflows import UpstreamRow, WorkflowStore
from forklift.workflow import Named, checked_name, step_options, task_name, unique_name

Reads = Callable[[], AbstractContextManager[psycopg.Connection[Any]]]


class Upstream(Mapping[str, Any]):
    """The jobs a step ran after, by step name (or job id): `ctx.upstream["extract"]` is
    that step's result (None: its handler returned none). A step that ran after one with
    `ignore_failure=True` may find it dead or cancelled: reading its result raises
    forklift.UpstreamFailed; `failed` says which did, with their errors."""

    def __init__(self, rows: list[UpstreamRow]) -> None:
        self._rows = {r.step or str(r.id): r for r in rows}
        self._ids = {r.id: r for r in rows}

    def _row(self, key: str | int) -> UpstreamRow:
        found = self._ids.get(key) if isinstance(key, int) else self._rows.get(key)
        if found is None:
            raise KeyError(key)
        return found

    def __getitem__(self, key: str | int) -> Any:
        row = self._row(key)
        if row.state != "succeeded":
            raise UpstreamFailed(row.step or str(row.id), row.state, row.last_error)
        return None if row.result is None else json.loads(row.result)

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def state(self, key: str | int) -> str:
        """The upstream job's state: 'succeeded', or 'dead' or 'cancelled' (only over
        an edge that ignores failure)."""
        return self._row(key).state

    def job_id(self, key: str | int) -> int:
        return self._row(key).id

    @property
    def failed(self) -> dict[str, str | None]:
        """{step: last error} of the upstream jobs that did not succeed."""
        return {name: r.last_error for name, r in self._rows.items() if r.state != "succeeded"}


class StepWorkflow:
    """The workflow a running step belongs to (ctx.workflow): its id, name and context,
    and `add()`, which grows it."""

    def __init__(
        self,
        found: tuple[int, str, dict[str, Any], str],
        parent: Parent,
        store: WorkflowStore,
        build: Callable[..., NewJob],
    ) -> None:
        self.id, self.name, self.context, parent.step = found
        self._parent = parent
        self._store = store
        self._build = build
        self._added: dict[int, str] = {}  # the steps this attempt added: id, name
        self._names: set[str] = set()  # theirs
        self._tried: dict[str, int] = {}  # unique_name's

    def add(
        self,
        task: Named | str,
        args: Mapping[str, Any] | None = None,
        *,
        after: tuple[int, ...] | list[int] = (),
        name: str | None = None,
        **options: Any,
    ) -> int:
        """Add a step to this workflow, to run after this step (and after the steps in
        `after`, ids this call returned earlier in this attempt); this step's dependents
        wait for it too. Its job's id. Named `<this step>/<task>` (then `#2`, ...) unless
        `name` is given: a retry of this step that adds the same steps in the same order
        finds them added already, and adds nothing twice. Committed with this step's
        effect transaction if one is open (undone with it), else at once."""
        step_options(options)
        unknown = [i for i in after if i not in self._added]
        if unknown:
            raise ArgumentError(
                f"after= takes ids of steps this step added, got {unknown}: a grown step "
                "runs after the step that added it"
            )
        wanted = f"{self._parent.step}/{task_name(task)}" if name is None else checked_name(name)
        if name is not None and name in self._names:
            raise ArgumentError(f"this step added a step named {name!r} already")
        step = unique_name(wanted, self._names.__contains__, self._tried)
        job = self._build(task_name(task), args, **options)
        with self._parent.reads() as conn:
            found = self._store.grow(
                self._parent.id, self._parent.owner, self._parent.attempt, step, job,
                list(after), conn,
            )  # fmt: skip
        if found is None:
            raise LeaseLost(f"job {self._parent.id} is no longer this worker's: nothing added")
        self._added[found] = step
        self._names.add(step)
        return found


class Parent:
    """The running step, as its workflow's growth is fenced by it."""

    def __init__(self, job_id: int, owner: str, attempt: int, reads: Reads) -> None:
        self.id = job_id
        self.step = ""  # read with its workflow
        self.owner = owner
        self.attempt = attempt
        self.reads = reads


def build_for(tasks: Mapping[str, Any], max_arg_bytes: int) -> Callable[..., NewJob]:
    """Jobs built as the worker's App would: its declared task's defaults and checks."""

    def build(name: str, args: Mapping[str, Any] | None, **options: Any) -> NewJob:
        spec = _job.JobSpec(name, {} if args is None else args, **options)
        return _job.build(spec, tasks.get(name), max_arg_bytes)

    return build


def _store(jobs: JobStore) -> WorkflowStore:
    return WorkflowStore(jobs.pool.connection, jobs.schema)


def load(job_id: int, jobs: JobStore, reads: Reads) -> Upstream:
    """Job `job_id`'s upstream jobs, read on `reads()`."""
    with reads() as conn:
        return Upstream(_store(jobs).upstream(job_id, conn))


def workflow(
    parent: Parent, jobs: JobStore, build: Callable[..., NewJob] | None
) -> StepWorkflow | None:
    """The workflow `parent` is a step of, read on its `reads()`; None if of none."""
    store = _store(jobs)
    with parent.reads() as conn:
        found = store.of_job(parent.id, conn)
    if found is None:
        return None
    return StepWorkflow(found, parent, store, build or build_for({}, _json.MAX_ARG_BYTES))
