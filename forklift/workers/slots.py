"""Job cost: a task declared `cost=4` takes 4 of its worker's concurrency slots, so a
memory- or thread-heavy job (8 BLAS threads, 20 GB) is not started beside others that
would oversubscribe the host.

The worker's app decides a job's cost (no column holds it: only a worker that declares
the task runs it, as with `max_snoozes`). Three places count it: the claim's room
(Holdings counts the slots of the jobs held, not the jobs), the claim's trim (a job past
the room is given back at once, uncharged, but the first: Claimer._fitted), and the
start (SlotGate: the handlers running never take more slots than the concurrency).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from forklift.errors import ConfigError

if TYPE_CHECKING:
    from forklift.app import App
    from forklift.workers.config import WorkerConfig

# How often a handler's start waiting for slots looks whether its job was taken from
# it meanwhile (released: it waited too long, or the worker stops).
LOOK_EVERY = 0.05


def costs(app: App, concurrency: int) -> dict[str, int]:
    """The slots each of `app`'s tasks that costs more than one takes, at most every
    slot: a job enqueued to a queue whose workers have fewer slots than its task's cost
    (its declared queue's are checked: check_costs) runs alone."""
    return {name: min(t.cost, concurrency) for name, t in app.tasks.items() if t.cost > 1}


def check_costs(app: App, config: WorkerConfig) -> None:
    """Refuse a worker whose queues take a task that costs more slots than it has
    (ConfigError): the task's jobs would never fit."""
    for name, task in app.tasks.items():
        if task.cost > config.concurrency and task.queue in config.queues:
            raise ConfigError(
                f"task {name!r} costs {task.cost} slots, more than this worker's "
                f"concurrency ({config.concurrency}) in queue {task.queue!r}: raise "
                f"--concurrency to {task.cost} at least, or serve that queue elsewhere"
            )


class SlotGate:
    """The start of handlers whose tasks cost more than one slot: a job starts only once
    its cost fits in the slots no running handler takes, in the order the jobs came
    (first come, first started: a costly job is not passed over for ever by cheap ones
    that each fit). None is used (nothing is counted) by a worker whose tasks all cost
    one."""

    def __init__(self, concurrency: int, costs: Mapping[str, int]) -> None:
        self.concurrency = concurrency
        self.costs = costs
        self._used = 0
        self._line: deque[object] = deque()
        self._changed = threading.Condition()

    def cost(self, task: str) -> int:
        return self.costs.get(task, 1)

    def enter(self, task: str, gone: Callable[[], bool]) -> int | None:
        """Wait for the slots a job of `task` takes, in turn; the slots taken, or None if
        `gone()` (its job was taken from it while it waited: nothing taken)."""
        cost, turn = self.cost(task), object()
        with self._changed:
            self._line.append(turn)
            try:
                while self._line[0] is not turn or self._used + cost > self.concurrency:
                    if gone():
                        return None
                    self._changed.wait(LOOK_EVERY)
                self._used += cost
                return cost
            finally:
                self._line.remove(turn)
                self._changed.notify_all()

    def leave(self, slots: int) -> None:
        """The handler that took `slots` returned."""
        with self._changed:
            self._used -= slots
            self._changed.notify_all()

    @property
    def used(self) -> int:
        """The slots running handlers take now."""
        return self._used
