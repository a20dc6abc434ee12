"""Notifications of ready jobs and operators' orders, from a dedicated LISTEN connection;
errors translated."""

from __future__ import annotations

from collections.abc import Iterator

from forklift.store._boundary import Conn, translated


class Notifications:
    """What one LISTEN connection hears: (channel, payload) pairs. On the job channel the
    payload is a queue name; on the control channel, an order."""

    def __init__(self, conn: Conn) -> None:
        self._conn = conn

    def wait(self, timeout: float) -> Iterator[tuple[str, str]]:
        """Yield each notification as it arrives, for up to `timeout` seconds."""
        with translated("listening failed"):
            for note in self._conn.notifies(timeout=timeout):
                yield note.channel, note.payload
