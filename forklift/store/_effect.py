"""A handler's effect transaction, committed together with its job's completion."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from forklift.errors import DatabaseError
from forklift.store._boundary import AsyncConn, Conn, translated


class EffectBudget:
    """How many effect transactions one worker process holds at once (--pool), its sync
    and its async handlers' together: each takes a slot before its connection and returns
    it with the connection. Two pools (psycopg's sync and async ones cannot share
    connections), one bound."""

    def __init__(self, size: int, timeout: float) -> None:
        self.size = size
        self.timeout = timeout  # how long a handler waits for a slot before its error
        self._slots = threading.BoundedSemaphore(size)
        self._waiting: ThreadPoolExecutor | None = None  # async waiters' blocking acquires
        self._lock = threading.Lock()

    def take(self) -> None:
        if not self._slots.acquire(timeout=self.timeout):
            raise self._none_free()

    async def take_async(self) -> None:
        """take() without blocking the event loop: a slot now, else wait in a thread."""
        if self._slots.acquire(blocking=False):
            return
        with self._lock:
            if self._waiting is None:
                self._waiting = ThreadPoolExecutor(self.size, "forklift-effect-wait")
            waiting = self._waiting
        taken = waiting.submit(self._slots.acquire, True, self.timeout)
        try:
            got = await asyncio.shield(asyncio.wrap_future(taken))
        except asyncio.CancelledError:
            taken.add_done_callback(self._return_unwanted)  # cancelled while it waited
            raise
        if not got:
            raise self._none_free()

    def give(self) -> None:
        self._slots.release()

    def _return_unwanted(self, taken: Future[bool]) -> None:
        if not taken.cancelled() and taken.exception() is None and taken.result():
            self._slots.release()

    def _none_free(self) -> DatabaseError:
        return DatabaseError(
            f"effect transaction failed: no connection free within {self.timeout:g} s "
            f"(--pool {self.size}: the handlers of this worker hold them all)"
        )


class Effect:
    """An open transaction on a pooled connection, which a handler's effect joins.

    The job's completion runs in it too, so the effect commits exactly when the job
    does (`commit_completing`); a failed handler rolls it back (`rollback`). Either way
    the connection is returned to its pool.
    """

    def __init__(
        self,
        pool: ConnectionPool[Conn],
        complete_sql: str,
        end_limits_sql: str,
        on_return: Callable[[], None] | None = None,
    ) -> None:
        self._pool = pool
        self._complete_sql = complete_sql
        self._end_limits_sql = end_limits_sql
        self._on_return = on_return  # the connection was returned (its budget slot frees)
        with translated("effect transaction failed"):
            try:
                self.conn = pool.getconn()
            except BaseException:
                if on_return is not None:
                    on_return()
                raise
            try:
                self._tx = self.conn.transaction()
                self._tx.__enter__()
            except BaseException:
                self._return_conn()
                raise

    def _return_conn(self) -> None:
        """Return the connection to its pool, and its slot to the budget."""
        try:
            self._pool.putconn(self.conn)
        finally:
            if self._on_return is not None:
                self._on_return()

    def commit_completing(
        self,
        job_id: int,
        attempt: int,
        owner: str,
        result: str | None = None,
        progress: str | None = None,
    ) -> bool:
        """Mark the job succeeded (with its `result` and last `progress`, JSON) in this
        transaction and commit both.

        False when `owner` no longer holds the lease: both roll back. A DatabaseError
        when the completion or the commit fails: nothing commits either.
        """
        params = {"ids": [job_id], "attempts": [attempt], "owner": owner}
        params |= {"results": [result], "progress": [progress]}

        def complete(conn: Conn) -> bool:
            with conn.pipeline():
                # The handler's statement bound ends here: the completion is the worker's
                # statement. Pipelined, the reset costs no round trip of its own.
                conn.execute(self._end_limits_sql)
                return conn.execute(self._complete_sql, params).fetchone() is not None

        return self.commit_with(complete, "completion failed")

    def commit_with(self, write: Callable[[Conn], bool], doing: str = "checkpoint failed") -> bool:
        """Run `write` in this transaction (a fenced statement that says whether the job
        is still ours: its completion, or a checkpoint) and commit both; not ours, both
        roll back. Either way the transaction ends and its connection is returned (after
        a checkpoint, the handler's next block opens another). A DatabaseError, saying
        `doing`, when either fails (a commit's outcome then unknown)."""
        try:
            with translated(doing):
                owned = write(self.conn)
        except BaseException:
            self.rollback()
            raise
        if not owned:
            self.rollback()
            return False
        try:
            with translated("effect commit failed"):
                self._tx.__exit__(None, None, None)  # COMMIT; a failed one ends it too
        finally:
            self._return_conn()
        return True

    def rollback(self) -> None:
        """Roll the effect back and return the connection."""
        with translated("effect rollback failed"):
            try:
                self._tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
            finally:
                self._return_conn()


class AsyncEffect:
    """Effect for an async handler: its transaction on a psycopg AsyncConnection from the
    worker's async pool, the same completion statement, committed the same way."""

    def __init__(
        self,
        pool: AsyncConnectionPool[AsyncConn],
        conn: AsyncConn,
        tx: AbstractAsyncContextManager[Any],
        complete_sql: str,
        end_limits_sql: str,
        on_return: Callable[[], None] | None,
    ) -> None:
        self._pool = pool
        self.conn = conn
        self._tx = tx
        self._complete_sql = complete_sql
        self._end_limits_sql = end_limits_sql
        self._on_return = on_return

    @classmethod
    async def begin(
        cls,
        pool: AsyncConnectionPool[AsyncConn],
        complete_sql: str,
        end_limits_sql: str,
        on_return: Callable[[], None] | None = None,
    ) -> AsyncEffect:
        with translated("effect transaction failed"):
            try:
                conn = await pool.getconn()
            except BaseException:
                if on_return is not None:
                    on_return()
                raise
            effect = cls(pool, conn, conn.transaction(), complete_sql, end_limits_sql, on_return)
            try:
                await effect._tx.__aenter__()
            except BaseException:
                await effect._return_conn()
                raise
        return effect

    async def _return_conn(self) -> None:
        """Return the connection to its pool, and its slot to the budget."""
        try:
            await self._pool.putconn(self.conn)
        finally:
            if self._on_return is not None:
                self._on_return()

    async def commit_completing(
        self,
        job_id: int,
        attempt: int,
        owner: str,
        result: str | None = None,
        progress: str | None = None,
    ) -> bool:
        """Effect.commit_completing, awaited."""
        params: dict[str, Any] = {"ids": [job_id], "attempts": [attempt], "owner": owner}
        params |= {"results": [result], "progress": [progress]}

        async def complete(conn: AsyncConn) -> bool:
            async with conn.pipeline():
                await conn.execute(self._end_limits_sql)
                cur = await conn.execute(self._complete_sql, params)
            return await cur.fetchone() is not None

        return await self.commit_with(complete, "completion failed")

    async def commit_with(
        self, write: Callable[[AsyncConn], Awaitable[bool]], doing: str = "checkpoint failed"
    ) -> bool:
        """Effect.commit_with, awaited."""
        try:
            with translated(doing):
                owned = await write(self.conn)
        except BaseException:
            await self.rollback()
            raise
        if not owned:
            await self.rollback()
            return False
        try:
            with translated("effect commit failed"):
                await self._tx.__aexit__(None, None, None)  # COMMIT; a failed one ends it too
        finally:
            await self._return_conn()
        return True

    async def rollback(self) -> None:
        """Roll the effect back and return the connection."""
        with translated("effect rollback failed"):
            try:
                await self._tx.__aexit__(psycopg.Rollback, psycopg.Rollback(), None)
            finally:
                await self._return_conn()
