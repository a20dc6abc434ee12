"""SlotGate (workers/slots.py): the start of handlers by their cost, in turn, never past
the concurrency; a start whose job was taken from it while it waited gives up."""

from __future__ import annotations

import threading
import time

from forklift._names import MAX_LABELS, label_sets
from forklift.testing import wait_for
from forklift.workers.slots import SlotGate


def waiting(gate: SlotGate, task: str, into: list[str], gone: threading.Event) -> threading.Thread:
    def enter() -> None:
        slots = gate.enter(task, gone.is_set)
        into.append(task if slots is not None else f"gave up {task}")

    thread = threading.Thread(target=enter, daemon=True)
    thread.start()
    return thread


def test_a_start_waits_for_its_slots_and_passes_no_one_in_line() -> None:
    gate = SlotGate(4, {"heavy": 3})
    never = threading.Event()
    assert gate.enter("light", never.is_set) == 1
    assert gate.enter("light", never.is_set) == 1
    started: list[str] = []
    heavy = waiting(gate, "heavy", started, never)
    wait_for(lambda: len(gate._line) == 1, what="heavy in line")
    light = waiting(gate, "light", started, never)  # fits, but heavy came first
    wait_for(lambda: len(gate._line) == 2, what="light in line")
    time.sleep(0.1)  # (a start that jumped the line would have been made by now)
    assert started == [] and gate.used == 2
    gate.leave(1)
    heavy.join(5)
    assert started == ["heavy"] and gate.used == 4
    light.join(0.2)
    assert light.is_alive()  # 4 of 4 slots taken
    gate.leave(3)
    light.join(5)
    assert started == ["heavy", "light"] and gate.used == 2


def test_a_start_whose_job_was_taken_gives_up_its_place() -> None:
    gate = SlotGate(2, {"heavy": 2})
    never, gone = threading.Event(), threading.Event()
    assert gate.enter("light", never.is_set) == 1
    started: list[str] = []
    heavy = waiting(gate, "heavy", started, gone)
    wait_for(lambda: len(gate._line) == 1, what="heavy in line")
    light = waiting(gate, "light", started, never)
    gone.set()  # the heavy job was released while it waited
    heavy.join(5)
    light.join(5)
    assert started == ["gave up heavy", "light"] and gate.used == 2


def test_many_threads_never_take_more_slots_than_there_are() -> None:
    gate = SlotGate(5, {"a": 2, "b": 3, "c": 5})
    never = threading.Event()
    lock = threading.Lock()
    most = [0]

    def work(task: str) -> None:
        for _ in range(50):
            slots = gate.enter(task, never.is_set)
            assert slots is not None
            with lock:
                most[0] = max(most[0], gate.used)
            gate.leave(slots)

    threads = [threading.Thread(target=work, args=(t,)) for t in "abcdd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert most[0] <= 5 and gate.used == 0 and not gate._line


def test_label_sets_are_every_set_of_a_workers_labels_as_jobs_store_them() -> None:
    assert label_sets(("gpu",)) == ["gpu"]
    assert label_sets(("a", "gpu", "model-x")) == [
        "a", "gpu", "model-x", "a,gpu", "a,model-x", "gpu,model-x", "a,gpu,model-x",
    ]  # fmt: skip
    assert len(label_sets(tuple(f"l{i:02d}" for i in range(MAX_LABELS)))) == 2**MAX_LABELS - 1
