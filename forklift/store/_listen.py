"""Notifications of ready jobs, from a dedicated LISTEN connection; errors translated."""

from __future__ import annotations

from collections.abc import Iterator

from forklift.store._boundary import Conn, translated


class Notifications:
    """The queue names notified on the job channel of one LISTEN connection."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def wait(self, timeout: float) -> Iterator[str]:
        """Yield each notified queue name as it arrives, for up to `timeout` seconds."""
        with translated("listening failed"):
            for note in self._conn.notifies(timeout=timeout):
                yield note.payload
