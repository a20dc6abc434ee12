"""Lease owner ids: who holds a job, unique to one process incarnation."""

from __future__ import annotations

import os
import secrets
import socket


def make_owner(pid: int | None = None, nonce: str | None = None) -> str:
    """A lease owner id unique to one process incarnation: host:pid:nonce."""
    return f"{socket.gethostname()}:{pid or os.getpid()}:{nonce or secrets.token_hex(3)}"


def application_name(owner: str) -> str:
    """What a worker's sessions are called in pg_stat_activity: `forklift-worker:pid:nonce`.

    The pid says which process on its host; the nonce tells it from a process of the
    same pid on another host (the host name itself may not fit in the 63 bytes).
    """
    return "forklift-worker:" + ":".join(owner.rsplit(":", 2)[-2:])
