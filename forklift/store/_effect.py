"""A handler's effect transaction, committed together with its job's completion."""

from __future__ import annotations

import psycopg
from psycopg_pool import ConnectionPool

from forklift.store._boundary import Conn, translated


class Effect:
    """An open transaction on a pooled connection, which a handler's effect joins.

    The job's completion runs in it too, so the effect commits exactly when the job
    does (`commit_completing`); a failed handler rolls it back (`rollback`). Either way
    the connection goes back to the pool.
    """

    def __init__(self, pool: ConnectionPool[Conn], complete_sql: str, end_limits_sql: str) -> None:
        self._pool = pool
        self._complete_sql = complete_sql
        self._end_limits_sql = end_limits_sql
        with translated("effect transaction failed"):
            self.conn = pool.getconn()
            try:
                self._tx = self.conn.transaction()
                self._tx.__enter__()
            except BaseException:
                pool.putconn(self.conn)
                raise

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
        try:
            with translated("completion failed"), self.conn.pipeline():
                # The handler's statement bound ends here: the completion is the worker's
                # statement. Pipelined, the reset costs no round trip of its own.
                self.conn.execute(self._end_limits_sql)
                owned = self.conn.execute(self._complete_sql, params).fetchone() is not None
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
            self._pool.putconn(self.conn)
        return True

    def rollback(self) -> None:
        """Roll the effect back and return the connection."""
        with translated("effect rollback failed"):
            try:
                self._tx.__exit__(psycopg.Rollback, psycopg.Rollback(), None)
            finally:
                self._pool.putconn(self.conn)
