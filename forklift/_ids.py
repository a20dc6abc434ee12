"""Lease owner ids: who holds a job, unique to one process incarnation."""

from __future__ import annotations

import os
import secrets
import socket


def make_owner(pid: int | None = None, nonce: str | None = None) -> str:
    """A lease owner id unique to one process incarnation: host:pid:nonce."""
    return f"{socket.gethostname()}:{pid or os.getpid()}:{nonce or secrets.token_hex(3)}"
