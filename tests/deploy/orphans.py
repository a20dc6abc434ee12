"""A test app whose task leaves an orphan: a process whose parent exits before it does.

An orphan is re-parented to PID 1 of its PID namespace, which in a container is the
supervisor; when it exits, only PID 1 can reap it. The task also records whether it
could write a file, to show the filesystem it ran on was read-only.
"""

from __future__ import annotations

import os
import select

import forklift

app = forklift.App()
SCHEMA = app.schema


def parent_of(pid: int) -> int | None:
    """PPid of `pid`, as this PID namespace numbers it; None once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("PPid:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _leave_orphan(linger: float) -> tuple[int, int]:
    """Double-fork: the middle process exits at once; the orphan exits once the returned
    `go` pipe is closed (or after `linger` seconds), so its parent can be read first,
    however slow the machine."""
    read_fd, write_fd = os.pipe()
    go_read, go_write = os.pipe()
    middle = os.fork()
    if middle == 0:
        orphan = os.fork()
        if orphan == 0:
            for fd in (go_write, read_fd, write_fd):  # the task reads the pid to EOF
                os.close(fd)
            select.select([go_read], [], [], linger)  # until the task says go (EOF)
            os._exit(0)
        os.write(write_fd, str(orphan).encode())
        os._exit(0)
    os.close(write_fd)
    os.close(go_read)
    os.waitpid(middle, 0)
    with os.fdopen(read_fd) as pipe:
        return int(pipe.read()), go_write


def _can_write() -> str:
    path = f"/tmp/forklift-write-probe-{os.getpid()}"
    try:
        with open(path, "w"):
            pass
    except OSError as exc:
        return exc.strerror or "no"
    os.unlink(path)
    return "yes"


@app.task(name="orphan")
def orphan(ctx: forklift.JobContext, *, linger: float) -> None:
    """Leave an orphan; record its pid, its parent once re-parented, and whether this
    process could write to /tmp."""
    pid, go = _leave_orphan(linger)
    parent = parent_of(pid)  # re-parented when the middle process exited
    os.close(go)  # now the orphan may exit: only PID 1 can reap it
    with ctx.transaction() as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.effects (job_id, key, n) VALUES (%s, %s, %s)",
            (ctx.job_id, f"parent={parent} writable={_can_write()}", pid),
        )
