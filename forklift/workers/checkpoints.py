"""Checkpoints: where a resumable job's next attempt starts (ctx.checkpoint, ctx.iterate,
ctx.step).

A job's checkpoint is one JSON document in its row (migration 0018): the handler's own
state, a cursor per loop, the recorded result of each step done, and the seconds of work
it stands for. It is read once per attempt, on first use, and written whole, always
fenced by owner and attempt (store/queries.sql, job_checkpoint_many), by one of:

- the progress writer's thread, at most every `every` seconds, for what changed outside
  an effect transaction (workers/progress.py);
- the handler itself at a commit point: an effect transaction open, the checkpoint is
  written in it and both commit at once, so "rows 0..N imported" and "cursor N" are one
  fact (`Resumable.commit`); with `flush=True` or a step, on a connection of its own;
- the recorder, before it writes a failed attempt or releases the job (`unwritten`).

What a handler records inside an effect block waits, in `in_tx`, until the block's
transaction commits: the writer's thread never sees it, so a crash before the commit
loses the cursor together with the rows it stood for.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from forklift import _json
from forklift._events import emit
from forklift.errors import DatabaseError, LeaseLost, ResultError
from forklift.store import (
    AsyncEffect,
    Conn,
    Effect,
    JobStore,
    job_checkpoint,
    job_checkpoint_many,
    job_checkpoint_many_async,
)


class Handled(Protocol):
    """What of a JobContext this module reads and changes (it does not import it: the
    context imports this module)."""

    _effect: Effect | AsyncEffect | None  # the handler's open effect transaction
    _depth: int  # effect blocks open around the handler's code now
    _cancelled: bool
    _stopping: bool
    _resumable: Resumable | None
    checkpoint_every: float  # seconds between checkpoints written (the handler may set it)

    @property
    def job_id(self) -> int: ...
    @property
    def attempt(self) -> int: ...
    @property
    def task(self) -> str: ...
    @property
    def runs_async(self) -> bool: ...
    @property
    def max_bytes(self) -> int: ...
    def _reads(self) -> AbstractContextManager[Conn]: ...
    def cancel(self) -> None: ...
    def ran_for(self) -> float: ...
    def resumable(self) -> Resumable: ...


log = logging.getLogger("forklift.workers.worker")

# Seconds between checkpoints written outside an effect transaction: after a kill, at
# most this much work (and the writer's half second) is done again.
EVERY = 1.0

# Where a change goes in the document: its handler's state, a loop's cursor, a step's result.
STATE, CURSOR, STEP = "state", "cursors", "steps"


class Resumable:
    """One attempt's view of its job's checkpoint: loaded on first use, changed by the
    handler, written by whoever reaches a commit point first (see the module's doc)."""

    def __init__(self, ctx: Handled, store: JobStore, owner: str) -> None:
        self.ctx = ctx
        self.store = store
        self.owner = owner
        self.lock = threading.Lock()  # the document's version and what is unwritten
        self.doc: dict[str, Any] = {}
        self.dirty = False  # changed outside a transaction since last written
        self.written_at = time.monotonic()
        # Changes made while an effect transaction is open: (kind, key) -> (block depth,
        # value); they commit with that transaction or not at all.
        self.in_tx: dict[tuple[str, str], tuple[int, Any]] = {}
        self.urgent = False  # an explicit checkpoint or a step waits in in_tx
        self.resumed: tuple[float, float] | None = None  # (age, seconds of work) at load
        self._ran_before = 0.0
        # An inline job (forklift.testing: a negative id) has no row: its checkpoint is
        # kept in memory, as its progress is.
        self.stored = ctx.job_id > 0
        if self.stored:
            self._load()

    def _load(self) -> None:
        with self.ctx._reads() as conn:
            found, age = job_checkpoint(self.store, self.ctx.job_id, conn)
        if isinstance(found, dict):
            self.doc = found
            self._ran_before = _number(found.get("ran"))
            self.resumed = (age, self._ran_before)

    # -- reading -------------------------------------------------------------------------

    def state(self) -> Any:
        return self._latest(STATE, "")

    def cursor(self, name: str) -> Any:
        return self._latest(CURSOR, name)

    def step(self, name: str) -> tuple[bool, Any]:
        """(done, its result): a step done in this attempt (even uncommitted) or before."""
        with self.lock:
            if (STEP, name) in self.in_tx:
                return True, self.in_tx[STEP, name][1]
            steps = self.doc.get(STEP)
            if isinstance(steps, dict) and name in steps:
                return True, steps[name]
        return False, None

    def _latest(self, kind: str, key: str) -> Any:
        with self.lock:
            if (kind, key) in self.in_tx:
                return self.in_tx[kind, key][1]
            return _get(self.doc, kind, key)

    # -- changing ------------------------------------------------------------------------

    def change(self, kind: str, key: str, value: Any, *, urgent: bool) -> None:
        """Record a change: into the open effect transaction's if there is one (committed
        with it), else into the document (written at the next round, or now)."""
        ctx = self.ctx
        with self.lock:
            if ctx._effect is not None:
                self.in_tx[kind, key] = (ctx._depth, value)
                self.urgent |= urgent
            else:
                _put(self.doc, kind, key, value)
                self.dirty = True

    def dropped(self, depth: int) -> None:
        """An effect block at `depth` rolled back: forget what was recorded inside it."""
        with self.lock:
            self.in_tx = {k: (d, v) for k, (d, v) in self.in_tx.items() if d < depth}
            if not self.in_tx:
                self.urgent = False

    def rolled_back(self) -> None:
        """The whole effect transaction rolled back: nothing in it stands."""
        with self.lock:
            self.in_tx.clear()
            self.urgent = False

    def cursor_due(self) -> bool:
        """Whether the open transaction should commit with a loop's cursor now, at an
        item boundary: the cursor has waited its interval (or something more urgent)."""
        return bool(self.in_tx) and (
            self.urgent or time.monotonic() - self.written_at >= self.ctx.checkpoint_every
        )

    # -- writing -------------------------------------------------------------------------

    def _versioned(self, doc: dict[str, Any]) -> str:
        """`doc` as the next version to write (under the lock)."""
        doc["v"] = int(_number(doc.get("v"))) + 1
        doc["ran"] = round(self._ran_before + self.ctx.ran_for(), 3)
        return json.dumps(doc, separators=(",", ":"), allow_nan=False)

    def _merged(self) -> dict[str, Any]:
        doc: dict[str, Any] = json.loads(json.dumps(self.doc))  # a copy of its own
        for (kind, key), (_, value) in self.in_tx.items():
            _put(doc, kind, key, value)
        return doc

    def due(self, now: float) -> str | None:
        """For the writer's thread: the document to write now, if it changed outside a
        transaction and its interval has passed (it counts as written from now: a change
        meanwhile is written next time)."""
        if not self.dirty or now - self.written_at < self.ctx.checkpoint_every:
            return None
        return self.unwritten()

    def unwritten(self) -> str | None:
        """The document as its next version, if it changed since last written."""
        with self.lock:
            if not self.dirty:
                return None
            self.dirty = False
            self.written_at = time.monotonic()
            try:
                return self._versioned(self.doc)
            except (TypeError, ValueError):  # checked when recorded; never fail a write
                return None

    def unsent(self) -> None:
        """A write of `unwritten()` failed: the document is to be written again."""
        self.dirty = True

    def flush(self) -> None:
        """Write the document now, on a connection of its own (no transaction is open);
        LeaseLost if the job is not ours any more."""
        text = self.unwritten()
        if text is None or not self.stored:
            return
        pool = self.store.effects if self.store.effects is not None else self.store.pool
        try:
            with pool.connection() as conn:
                held = [(self.ctx.job_id, self.ctx.attempt, text)]
                owned = bool(job_checkpoint_many(self.store, held, self.owner, conn))
        except BaseException:
            self.unsent()
            raise
        if not owned:
            self._lost()

    def commit(self, effect: Effect) -> None:
        """Commit the open effect transaction with the checkpoint, the changes made in
        it included; LeaseLost (both rolled back) if the job is not ours any more."""
        with self.lock:
            doc = self._merged()
            text = self._versioned(doc)
            held = [(self.ctx.job_id, self.ctx.attempt, text)]
            self.ctx._effect = None
            owned = effect.commit_with(
                lambda conn: (
                    not self.stored or bool(job_checkpoint_many(self.store, held, self.owner, conn))
                )
            )
            self._committed(doc, owned)
        if not owned:
            self._lost()

    async def commit_async(self, effect: AsyncEffect) -> None:
        """commit() for an async handler's effect transaction."""
        with self.lock:  # held across the await: only the writer's thread contends
            doc = self._merged()
            text = self._versioned(doc)
            held = [(self.ctx.job_id, self.ctx.attempt, text)]
            self.ctx._effect = None

            async def write(conn: Any) -> bool:
                if not self.stored:
                    return True
                return bool(await job_checkpoint_many_async(self.store, held, self.owner, conn))

            owned = await effect.commit_with(write)
            self._committed(doc, owned)
        if not owned:
            self._lost()

    def _committed(self, doc: dict[str, Any], owned: bool) -> None:
        """The commit of `doc` ended: committed (`owned`), its changes are the document's
        (in place: a loop holds on to its cursors), else they are gone with it."""
        if owned:
            for (kind, key), (_, value) in self.in_tx.items():
                _put(self.doc, kind, key, value)
            self.doc["v"], self.doc["ran"] = doc["v"], doc["ran"]
            self.dirty = False
            self.written_at = time.monotonic()
        self.in_tx.clear()
        self.urgent = False

    def _lost(self) -> None:
        self.ctx.cancel()
        raise LeaseLost(
            f"job {self.ctx.task}#{self.ctx.job_id}: its lease is not this worker's any "
            "more; its checkpoint (and what committed with it) was not written"
        )


def unwritten(contexts: Sequence[Handled]) -> list[tuple[int, int, str]]:
    """The (id, attempt, checkpoint JSON) of those jobs whose checkpoint changed since it
    was last written: to go with their failed attempt or their release."""
    found = []
    for ctx in contexts:
        resumable = ctx._resumable
        if resumable is not None and (text := resumable.unwritten()) is not None:
            found.append((ctx.job_id, ctx.attempt, text))
    return found


def write_unwritten(store: JobStore, owner: str, contexts: Sequence[Handled]) -> None:
    """Write the checkpoints not written yet of jobs about to fail or be released; a
    failure to is said by the caller's next statement, which fails the same way."""
    found = unwritten(contexts)
    if found:
        try:
            job_checkpoint_many(store, found, owner)
        except DatabaseError as exc:
            emit(log, "job.checkpoint_failed", logging.WARNING, jobs=len(found), error=exc)
            for ctx in contexts:
                if ctx._resumable is not None:
                    ctx._resumable.unsent()


def checked(value: Any, max_bytes: int, what: str) -> Any:
    """`value` as it will be stored (a JSON round trip), or a ResultError saying why it
    cannot be (not JSON, or over `max_bytes`: the cap of a result)."""
    try:
        return json.loads(_json.dumps_result(value, max_bytes, what=what))
    except ResultError as exc:
        if str(exc).startswith(what):
            raise
        raise ResultError(f"{what}: {exc}") from None  # a part of it: say of what


def reached(ctx: Handled, *, flush: bool) -> None:
    """A commit point of the handler's (a checkpoint, a step): commit an open effect
    transaction with the checkpoint if no block is open around it (else the outermost
    block's end does), or, with none open, write the checkpoint now if `flush`."""
    if ctx._depth:
        return
    if isinstance(ctx._effect, Effect):
        ctx.resumable().commit(ctx._effect)
    elif flush and ctx._effect is None:
        if ctx.runs_async:
            raise TypeError(
                "ctx.checkpoint(flush=True) would block an async handler's event loop: "
                "checkpoint inside `async with ctx.transaction()` to have it commit"
            )
        ctx.resumable().flush()


def done(ctx: Handled, name: str, value: Any) -> Any:
    """Record step `name` done with `value` (as stored: JSON); the stored value."""
    stored = checked(value, ctx.max_bytes, f"step {name!r}'s result")
    ctx.resumable().change(STEP, name, stored, urgent=True)
    return stored


def _get(doc: dict[str, Any], kind: str, key: str) -> Any:
    if kind == STATE:
        return doc.get(STATE)
    found = doc.get(kind)
    return found.get(key) if isinstance(found, dict) else None


def _put(doc: dict[str, Any], kind: str, key: str, value: Any) -> None:
    if kind == STATE:
        doc[STATE] = value
    else:
        doc.setdefault(kind, {})[key] = value


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0
