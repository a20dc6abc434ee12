"""`python bench/_boot_probe.py MARKS ARGS...`: `forklift ARGS...` with its boot timed.

bench.cpu runs `forklift run` through this script to split spawn -> first claim into
its parts. It wraps a few of forklift's functions (before any of them runs) so that
each appends `pid label time.time()` to the file MARKS as it begins or returns, in the
supervisor and in its forked children alike; then it calls forklift's main() as
`python -m forklift` would. The wrappers cost microseconds; the parts they mark are
milliseconds. The names wrapped are forklift's internals: when one moves, the bench
says which (a KeyError naming it) rather than measuring something else.
"""

from __future__ import annotations

import time

STARTED = time.time()  # the interpreter is up: the first line of Python run

import functools  # noqa: E402 - after the first mark, on purpose
import importlib  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

_fd = -1


def mark(label: str, at: float | None = None) -> None:
    """Append `pid label time` to the marks file (one write: lines never interleave)."""
    os.write(_fd, f"{os.getpid()} {label} {time.time() if at is None else at:.6f}\n".encode())


# What is wrapped: (module:Qual.name, label, when); and the claim that marks the end.
WRAPPED = [
    ("forklift._loading:load_app", "app_import", "both"),
    ("forklift.supervisor.arbiter:Supervisor.run", "supervisor_run", "begin"),
    ("forklift.supervisor.spawner:Spawner.start", "fork_server", "end"),
    ("forklift.supervisor.spawner:Spawner.spawn", "fork", "begin"),
    ("forklift.supervisor.spawner:child_main", "child", "begin"),
    ("forklift.workers.worker:Worker._boot", "boot", "both"),
    ("forklift.workers.connections:WorkerConnections.open", "pools_opened", "end"),
    ("forklift._db:LivePool.getconn", "first_connection", "end"),
]
CLAIM = "forklift.workers.claimer:Claimer.claim"


def found(target: str) -> tuple[Any, str]:
    """(the module or class holding `module:Qual.name`, the name); KeyError if gone."""
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, name = qualname.split(".")
    for part in path:
        owner = getattr(owner, part, None)
    if owner is None or name not in vars(owner):
        raise KeyError(f"bench/_boot_probe.py: {target} is gone; update the probe")
    return owner, name


def wrap(target: str, label: str, *, first_only: bool = True, when: str = "end") -> None:
    """Mark `label` when `module:Qual.name` begins ("begin"), returns ("end"), or both.

    `first_only`: only the first call in each process (a fork starts counting afresh).
    """
    owner, name = found(target)
    held = vars(owner)[name]

    def binder(f: Callable[..., Any]) -> Any:
        return classmethod(f) if isinstance(held, classmethod) else f

    original: Callable[..., Any] = getattr(held, "__func__", held)
    seen: set[int] = set()

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        fresh = os.getpid() not in seen
        if fresh or not first_only:
            seen.add(os.getpid())
            if when in ("begin", "both"):
                mark(f"{label}.begin" if when == "both" else label)
        result = original(*args, **kwargs)
        if (fresh or not first_only) and when in ("end", "both"):
            mark(f"{label}.end" if when == "both" else label)
        return result

    setattr(owner, name, binder(wrapper))


def claimed(target: str, label: str) -> None:
    """Mark `label` when `module:Qual.name` first returns a claim that holds jobs."""
    cls, name = found(target)
    original = vars(cls)[name]
    done: set[int] = set()

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = original(*args, **kwargs)
        if os.getpid() not in done and result.jobs:
            done.add(os.getpid())
            mark(label)
        return result

    setattr(cls, name, wrapper)


def main() -> int:
    global _fd
    marks, *argv = sys.argv[1:]
    _fd = os.open(marks, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    mark("interpreter", STARTED)
    import forklift.cli

    mark("cli_imported")
    # Imported here only to be wrapped (their import is timed by the marks around them).
    for target, label, when in WRAPPED:
        wrap(target, label, when=when)
    claimed(CLAIM, "first_claim")
    sys.argv = ["forklift", *argv]
    return forklift.cli.main(argv)


if __name__ == "__main__":
    sys.exit(main())
