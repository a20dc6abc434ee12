"""The peers venv of bench.compare (.venv-peers, git-ignored) and the Redis for Celery.

The peer job queues are never forklift's dependencies: they live in a venv of their own,
made on first use with `python -m venv` and pip (the index pip is configured with), and
remade when REQUIREMENTS change. The peers' code (bench/peers/) runs with its python.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import venv
from pathlib import Path
from urllib.parse import urlsplit

from bench._harness import REPO_ROOT, say

PEERS_VENV = REPO_ROOT / ".venv-peers"
REQUIREMENTS = (
    "pgqueuer[asyncpg]==1.6.*",
    "procrastinate==3.10.*",
    "celery[redis]==5.7.*",
    "matplotlib",
)
DISTRIBUTIONS = ("pgqueuer", "asyncpg", "procrastinate", "psycopg", "celery", "kombu", "redis")


def ensure(root: Path = PEERS_VENV) -> Path:
    """The peers venv's python, after creating the venv or installing what changed."""
    python = root / "bin" / "python"
    marker = root / "bench-requirements.txt"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    if python.exists() and marker.exists() and marker.read_text() == wanted:
        return python
    if not python.exists():
        say(f"creating the peers venv {root.relative_to(REPO_ROOT)} ...")
        venv.create(root, with_pip=True)
    say(f"installing into it: {' '.join(REQUIREMENTS)} ...")
    subprocess.run(
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            *REQUIREMENTS,
        ],
        check=True,
    )
    marker.write_text(wanted)
    return python


def versions(python: Path) -> dict[str, str]:
    """The installed versions of the peers (and their drivers) in the venv of `python`."""
    code = (
        "import json, importlib.metadata as m; "
        f"print(json.dumps({{d: m.version(d) for d in {list(DISTRIBUTIONS)!r}}}))"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    found: dict[str, str] = json.loads(out.stdout)
    return found


def redis_answers(url: str, timeout: float = 1.0) -> bool:
    """Whether a Redis server answers PING at `url` (redis://host:port/db)."""
    parts = urlsplit(url)
    try:
        with socket.create_connection(
            (parts.hostname or "127.0.0.1", parts.port or 6379), timeout
        ) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


def project_python() -> str:
    """This (the project's) interpreter, which runs forklift and the orchestrator."""
    return sys.executable
