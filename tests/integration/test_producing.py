"""Producing: what every way to enqueue writes, and what a producer loads."""

from __future__ import annotations

import json
import subprocess
import sys

# A producer's whole life: declare tasks and a schedule, enqueue every way, make batches.
PRODUCER = """
import asyncio, json, sys
import forklift

app = forklift.App()

@app.task
def add(ctx, *, a: int) -> int:
    return a

@app.periodic(every=60, name="tick")
def tick(ctx) -> None: ...

add.enqueue(a=1)
app.enqueue_many([("add", {"a": 2}), forklift.JobSpec("add", {"a": 3}, delay=60)])
app.enqueue_batch([("add", {"a": 4})], on_complete="add", on_complete_args={"a": 5})
with app.batch() as writer:
    writer.enqueue(add, a=6)
asyncio.run(app.enqueue_async("add", {"a": 7}))
app.close()
print(json.dumps(sorted(sys.modules)))
"""


def test_a_producer_loads_no_worker_module(env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-c", PRODUCER], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.splitlines()[-1])
    assert "forklift.app" in loaded
    assert [m for m in loaded if m.startswith(("forklift.workers", "forklift.supervisor"))] == []
