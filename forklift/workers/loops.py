"""ctx.iterate: a loop that resumes after the last item a previous attempt finished.

An item counts as done when its loop body finishes: when the loop is asked for the next
item (the boundary). Its cursor is then recorded: into the checkpoint document, which
the writer's thread writes every `checkpoint_every` seconds, or, while the body's effect
transaction is still open, into that transaction, which the boundary commits with the
cursor once the interval has passed (an async handler's loop does so with `async for`;
a plain `for` in one leaves the cursor to commit with the effect). So the rows an item
wrote and the cursor that says it is done commit together, or neither does.

Once the worker is stopping (or the job was cancelled, or its lease lost), the loop ends
at the next boundary with forklift.Interrupted, after committing what it can: the
recorder gives the job back with its checkpoint, its attempt not counted.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any

from forklift.errors import Interrupted
from forklift.store import AsyncEffect, Effect
from forklift.workers.checkpoints import CURSOR, Handled, Resumable


class Loop:
    """What ctx.iterate returns: iterated with `for`, or `async for` in an async handler
    (whose boundaries can then commit the effect transaction with the cursor)."""

    def __init__(
        self,
        ctx: Handled,
        source: Sequence[Any] | Callable[[Any], Sequence[Any]],
        cursor: Callable[[Any], Any] | None,
        name: str,
    ) -> None:
        self.indexed = not callable(source) or isinstance(source, Sequence)
        if self.indexed and cursor is not None:
            raise TypeError("ctx.iterate(cursor=...) is for a callable source (a page fetcher)")
        self.ctx = ctx
        self.source = source
        self.cursor_of = cursor or _itself
        self.name = name

    def __iter__(self) -> Iterator[Any]:
        ctx, name = self.ctx, self.name
        resumable = ctx.resumable()
        if not self.indexed:
            yield from self._paged(resumable)
            return
        source: Sequence[Any] = self.source  # type: ignore[assignment]
        done = resumable.cursor(name)
        cursors = _cursors(resumable, name, done)
        for index in range(done + 1 if isinstance(done, int) else 0, len(source)):
            if ctx._cancelled or ctx._stopping:
                self._interrupt()
            yield source[index]
            if ctx._effect is None:  # the tight loop's path: two stores, no call
                cursors[name] = index
                resumable.dirty = True
            else:
                self._advance_in_tx(resumable, index)

    def _paged(self, resumable: Resumable) -> Iterator[Any]:
        ctx, name = self.ctx, self.name
        done = resumable.cursor(name)
        cursors = _cursors(resumable, name, done)
        for after, item in self._pairs(done):
            if ctx._cancelled or ctx._stopping:
                self._interrupt()
            yield item
            if ctx._effect is None:
                cursors[name] = after
                resumable.dirty = True
            else:
                self._advance_in_tx(resumable, after)

    def _pairs(self, after: Any) -> Iterator[tuple[Any, Any]]:
        """(cursor, item) from the item after `after` (None: the first) to the last."""
        if self.indexed:
            source: Sequence[Any] = self.source  # type: ignore[assignment]
            for index in range(after + 1 if isinstance(after, int) else 0, len(source)):
                yield index, source[index]
            return
        fetch: Callable[[Any], Sequence[Any]] = self.source  # type: ignore[assignment]
        while page := fetch(after):
            for item in page:
                after = self.cursor_of(item)
                yield after, item

    async def __aiter__(self) -> AsyncIterator[Any]:
        ctx, name = self.ctx, self.name
        resumable = ctx.resumable()
        done = resumable.cursor(name)
        cursors = _cursors(resumable, name, done)
        for after, item in self._pairs(done):
            if ctx._cancelled or ctx._stopping:
                effect = ctx._effect
                if isinstance(effect, AsyncEffect) and not ctx._depth and resumable.in_tx:
                    await resumable.commit_async(effect)
                self._interrupt()
            yield item
            if ctx._effect is None:
                cursors[name] = after
                resumable.dirty = True
                continue
            resumable.change(CURSOR, name, after, urgent=False)
            effect = ctx._effect
            if isinstance(effect, AsyncEffect) and not ctx._depth and resumable.cursor_due():
                await resumable.commit_async(effect)

    def _advance_in_tx(self, resumable: Resumable, cursor: Any) -> None:
        """The cursor moved with the body's effect transaction open: it goes with that
        transaction, committed here once its interval has passed."""
        resumable.change(CURSOR, self.name, cursor, urgent=False)
        effect = self.ctx._effect
        if isinstance(effect, Effect) and not self.ctx._depth and resumable.cursor_due():
            resumable.commit(effect)

    def _interrupt(self) -> None:
        """End the loop at this boundary, committing the open effect transaction with the
        cursor where a plain def handler's loop can."""
        ctx = self.ctx
        effect, resumable = ctx._effect, ctx._resumable
        if isinstance(effect, Effect) and not ctx._depth and resumable and resumable.in_tx:
            resumable.commit(effect)
        why = "the worker is stopping" if ctx._stopping else "the job was cancelled"
        raise Interrupted(f"ctx.iterate({self.name!r}) stopped at an item boundary: {why}")


def _cursors(resumable: Resumable, name: str, start: Any) -> dict[str, Any]:
    """The document's cursors, with `name` in it (added under the lock: the writer's
    thread may be serialising the document)."""
    with resumable.lock:
        cursors: dict[str, Any] = resumable.doc.setdefault(CURSOR, {})
        cursors.setdefault(name, start)
        return cursors


def _itself(item: Any) -> Any:
    return item
