"""Process titles that say what each process is doing, as `ps` and `top` show them."""

from __future__ import annotations

import threading

from setproctitle import setproctitle


def supervisor_title(
    queues: tuple[str, ...], state: str, children: int, target: int, busy: int
) -> str:
    """`forklift supervisor [default]: running, 2/2 workers, 1 busy`."""
    return (
        f"forklift supervisor [{','.join(queues)}]: {state}, "
        f"{children}/{target} workers, {busy} busy"
    )


class ChildTitle:
    """`forklift worker 2/4 [default]: idle` / `...: running render#123` (thread-safe)."""

    def __init__(self, index: int, total: int, queues: tuple[str, ...]) -> None:
        self.prefix = f"forklift worker {index}/{total} [{','.join(queues)}]"
        self._running: dict[int, str] = {}
        self._waiting: str | None = None  # what it waits for before any work: migrate
        self._shown = ""  # the title last set
        # Held while the title is set too: two threads never leave the older title.
        self._lock = threading.RLock()

    @classmethod
    def standalone(cls, queues: tuple[str, ...]) -> ChildTitle:
        """`forklift worker [default]: idle`: a worker run without a supervisor."""
        title = cls(1, 1, queues)
        title.prefix = f"forklift worker [{','.join(queues)}]"
        return title

    def started(self, job_id: int, task: str) -> None:
        with self._lock:
            self._running[job_id] = task
            if len(self._running) <= 2:  # from idle, or one job, to something else
                self.update()

    def ended(self, job_id: int, *, show: bool = True) -> None:
        """The job is done; `show` False leaves the title as it is until update()."""
        with self._lock:
            self._running.pop(job_id, None)
            if show and len(self._running) <= 1:
                self.update()

    # Among many jobs at once (an async worker's hundreds) only the count changes: it is
    # shown at the next heartbeat's update(), not set (a system call) for every job.

    def waiting(self, what: str | None) -> None:
        """`...: waiting for migrate` until told None."""
        with self._lock:
            self._waiting = what
            self.update()

    def update(self) -> None:
        with self._lock:
            text = self.text()
            if text != self._shown:
                setproctitle(text)
                self._shown = text

    def text(self) -> str:
        with self._lock:
            jobs, waiting = list(self._running.items()), self._waiting
        if not jobs:
            return f"{self.prefix}: {waiting or 'idle'}"
        if len(jobs) == 1:
            job_id, task = jobs[0]
            return f"{self.prefix}: running {task}#{job_id}"
        return f"{self.prefix}: running {len(jobs)} jobs"
