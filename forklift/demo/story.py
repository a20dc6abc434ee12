"""What happened during the demo, one line per event, from the supervisor's log and the database."""

from __future__ import annotations

from typing import Any

from forklift._display import line
from forklift.demo.database import Snapshot, owner_pid


class Story:
    """Tells each event once: workers started and died, tiles charged and rendered again."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.started = 0
        self.pids: dict[Any, int] = {}  # worker slot -> pid
        self.charged: set[int] = set()
        self.rerendered: set[int] = set()

    def news(self, snapshot: Snapshot, log: list[dict[str, Any]]) -> list[str]:
        return [*filter(None, map(self._logged, log)), *self._changed(snapshot)]

    def _logged(self, entry: dict[str, Any]) -> str | None:
        # A log line's "pid" is the process that logged it (the supervisor): the worker's
        # pid comes from its lease owner (host:pid:nonce), and by its slot after that.
        event = entry["event"]
        if event == "child.started":
            self.started += 1
            pid = self.pids[entry.get("index")] = owner_pid(str(entry.get("owner")))
            again = " in its place" if self.started > self.workers else ""
            return f"supervisor started worker {pid}{again}"
        if event == "child.exited" and entry.get("reason") != "clean exit":
            # "WorkerDied: worker process killed by SIGKILL: possibly ..." -> the middle part
            reason = str(entry.get("reason", ""))
            how = (reason.partition(": ")[2] or reason).partition(": ")[0]
            return f"supervisor reaped worker {self.pids.get(entry.get('index'), '?')}: {line(how)}"
        return None

    def _changed(self, snapshot: Snapshot) -> list[str]:
        lines = []
        for job in snapshot.charged:
            if job.tile not in self.charged:
                self.charged.add(job.tile)
                lines.append(f"tile {job.tile} charged: {line(job.error)}")
        for tile, (pid, attempt) in sorted(snapshot.rerendered.items()):
            if tile not in self.rerendered:
                self.rerendered.add(tile)
                lines.append(f"tile {tile} rendered again by worker {pid} (attempt {attempt})")
        return lines
