"""An inline job's effect transaction: what its `ctx.transaction()` blocks join, on the
test's connection (a savepoint, inside the transaction the test has open) or on a
connection of its own.

A worker commits a handler's effect together with its job's completion, one statement
fenced by the job's row and lease (Effect.commit_completing). An inline job has no row,
so that statement would find nothing to mark and roll the effect back: here a success
ends the block alone (on the test's connection it releases the savepoint, and the effect
stays in the test's transaction, for its rollback to undo), and a failure rolls it back,
as the worker's does. JobContext runs the blocks themselves, unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg

from forklift import _db
from forklift.store import AsyncEffect, Conn, Effect, translated
from forklift.store._boundary import AsyncConn

APPLICATION_NAME = "forklift-inline"
# An own connection's bounds: the worker's effect bounds come from the task's timeout,
# which inline mode does not enforce on a plain def handler (see inline()).
TIMEOUTS = _db.Timeouts(statement=300.0, idle_in_transaction=3600.0)


class InlineEffect(Effect):
    """Effect, for an inline job: a transaction block on `conn`, ended without a
    completion statement; `own`: the connection is this effect's, closed at its end."""

    def __init__(self, conn: Conn, *, own: bool) -> None:
        # Not Effect.__init__, which takes its connection from a worker's pool.
        self.conn = conn
        self._own = own
        self._tx = conn.transaction()
        try:
            with translated("effect transaction failed"):
                self._tx.__enter__()
        except BaseException:
            self._close()
            raise

    @classmethod
    def of_own(cls, dsn: str) -> InlineEffect:
        """On a connection of its own to `dsn`: its transaction commits at a success."""
        with translated("effect transaction failed", _db.describe(dsn)):
            conn = _db.connect(dsn, TIMEOUTS, application_name=APPLICATION_NAME)
        return cls(conn, own=True)

    def commit_completing(
        self,
        job_id: int,
        attempt: int,
        owner: str,
        result: str | None = None,
        progress: str | None = None,
    ) -> bool:
        """End the block as committed (there is no row to complete); True."""
        try:
            with translated("effect commit failed"):
                self._tx.__exit__(None, None, None)
        finally:
            self._close()
        return True

    def commit_with(self, write: Callable[[Conn], bool], doing: str = "") -> bool:
        """A checkpoint's commit: the block ends as committed (no row to fence)."""
        return self.commit_completing(0, 0, "")

    def rollback(self) -> None:
        try:
            with translated("effect rollback failed"):
                self._tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
        finally:
            self._close()

    def _close(self) -> None:
        if self._own:
            self.conn.close()


class InlineAsyncEffect(AsyncEffect):
    """InlineEffect for an async def handler: a block on an AsyncConnection."""

    def __init__(self, conn: AsyncConn, tx: AbstractAsyncContextManager[Any], *, own: bool) -> None:
        # Not AsyncEffect.__init__, which takes a worker's pool and completion statement.
        self.conn = conn
        self._tx = tx
        self._own = own

    @classmethod
    async def of(cls, conn: AsyncConn | None, dsn: str) -> InlineAsyncEffect:
        """On `conn`, or (None) on a connection of its own to `dsn`."""
        own = conn is None
        with translated("effect transaction failed", _db.describe(dsn)):
            if conn is None:
                kwargs = _db.connect_kwargs(TIMEOUTS, APPLICATION_NAME, dsn)
                conn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, **kwargs)
            tx = conn.transaction()
            try:
                await tx.__aenter__()
            except BaseException:
                if own:
                    await conn.close()
                raise
        return cls(conn, tx, own=own)

    async def commit_completing(
        self,
        job_id: int,
        attempt: int,
        owner: str,
        result: str | None = None,
        progress: str | None = None,
    ) -> bool:
        """InlineEffect.commit_completing, awaited."""
        try:
            with translated("effect commit failed"):
                await self._tx.__aexit__(None, None, None)
        finally:
            await self._close()
        return True

    async def commit_with(
        self, write: Callable[[AsyncConn], Awaitable[bool]], doing: str = ""
    ) -> bool:
        """InlineEffect.commit_with, awaited."""
        return await self.commit_completing(0, 0, "")

    async def rollback(self) -> None:
        try:
            with translated("effect rollback failed"):
                await self._tx.__aexit__(psycopg.Rollback, psycopg.Rollback(), None)
        finally:
            await self._close()

    async def _close(self) -> None:
        if self._own:
            await self.conn.close()
