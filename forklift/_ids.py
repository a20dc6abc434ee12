"""Who holds a job (a lease owner id, unique to one process incarnation) and who acts on
one (an operator, as `user@host`)."""

from __future__ import annotations

import getpass
import os
import secrets
import socket


def make_owner(pid: int | None = None, nonce: str | None = None) -> str:
    """A lease owner id unique to one process incarnation: host:pid:nonce."""
    return f"{socket.gethostname()}:{pid or os.getpid()}:{nonce or secrets.token_hex(3)}"


def child_owner(supervisor_id: str, pid: int, nonce: str) -> str:
    """The lease owner id of a supervisor's child: `host:pid:nonce@spid.snonce`.

    It names its supervisor (`host:spid:snonce`), whose liveness lock vouches for it: a
    peer may charge the child's jobs only once that lock is free (supervisor/deaths.py).
    The `host:pid:` prefix reads as every other owner id does.
    """
    host, spid, snonce = supervisor_id.rsplit(":", 2)
    return f"{host}:{pid}:{nonce}@{spid}.{snonce}"


def owner_process(owner: str) -> tuple[str, int]:
    """The host and pid an owner id names (pid 0 if it names none: not one of ours)."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host, int(pid) if pid.isdigit() else 0


def liveness_holder(owner: str) -> str:
    """Whose liveness lock vouches for `owner`: its supervisor's for a child, its own
    for a process without one (`forklift worker`, a supervisor)."""
    head, at, tail = owner.partition("@")
    if not at:
        return owner
    host = head.split(":", 1)[0]
    spid, _, snonce = tail.partition(".")
    return f"{host}:{spid}:{snonce}"


def application_name(owner: str) -> str:
    """What a worker's sessions are called in pg_stat_activity: `forklift-worker:pid:nonce`.

    The pid says which process on its host; the nonce tells it from a process of the
    same pid on another host (the host name itself may not fit in the 63 bytes).
    """
    return "forklift-worker:" + ":".join(owner.rsplit(":", 2)[-2:])


def operator() -> str:
    """Who acts, as the error history records it: `user@host`."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "someone"
    return f"{user}@{socket.gethostname()}"
