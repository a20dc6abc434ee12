"""Celery's app and producer for bench.compare (the peers venv only), on the local Redis.

Workers: `python -m celery -A bench.peers.celery_peer worker -P prefork -c N -Q QUEUE`:
one main process and N pool processes, the pool its docs recommend for CPU-bound work.
The broker is $BENCH_REDIS, the queue $BENCH_CELERY_QUEUE (one per bench run, deleted
at its end), and no result backend (Celery's default; the tasks set ignore_result, as
its task guide advises when results are not used).

Celery keeps no job table to count completions in, so each pool process counts the
tasks it has finished (task_postrun) and a thread writes that count every 10 ms to
$BENCH_PROGRESS/<pid>, a file bench.compare adds up. The producer: Celery has no bulk
publish, so a batch is one `apply_async` per job, all on one producer connection
(`app.producer_or_acquire()`; faster here than `group(...).apply_async()`, which adds
group bookkeeping to every message), and one job is one `apply_async`.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

from celery import Celery
from celery.signals import task_postrun, worker_process_init

from bench.peers import _work

app = Celery("bench_compare", broker=os.environ.get("BENCH_REDIS", "redis://127.0.0.1:6379/0"))
app.conf.update(
    task_default_queue=os.environ.get("BENCH_CELERY_QUEUE", "bench_compare"),
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
)


@app.task(name="noop")
def noop() -> None:
    pass


@app.task(name="stamp")
def stamp(key: str, t: float) -> None:
    _work.started(key, t)


@app.task(name="burn")
def burn(iterations: int) -> None:
    _work.spin(iterations)


@app.task(name="nap")
def nap(seconds: float) -> None:
    _work.started("nap")
    time.sleep(seconds)


_finished = [0]


@task_postrun.connect
def _count(**_: Any) -> None:
    _finished[0] += 1


@worker_process_init.connect
def _start_counting(**_: Any) -> None:
    """In each pool process: write its count of finished tasks every 10 ms."""
    folder = os.environ.get("BENCH_PROGRESS")
    if not folder:
        return
    path = Path(folder) / str(os.getpid())

    def write() -> None:
        written = -1
        while True:
            count = _finished[0]
            if count != written:
                path.with_suffix(".tmp").write_text(str(count))
                path.with_suffix(".tmp").replace(path)
                written = count
            time.sleep(0.01)

    threading.Thread(target=write, name="bench-progress", daemon=True).start()


class Producer:
    async def open(self) -> None:
        app.connection_for_write().ensure_connection(max_retries=3)

    async def close(self) -> None:
        app.close()

    async def install(self) -> None:
        pass

    async def reset(self) -> None:
        app.control.purge()

    async def uninstall(self) -> None:
        queue = app.conf.task_default_queue
        with app.connection_for_write() as connection:
            bindings = (f"_kombu.binding.{queue}", f"_kombu.binding_permanent.{queue}")
            connection.default_channel.client.delete(queue, *bindings)

    async def enqueue(self, task: str, kwargs: dict[str, Any]) -> None:
        app.tasks[task].apply_async(kwargs=kwargs)

    async def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> None:
        send = app.tasks[task].apply_async
        with app.producer_or_acquire() as producer:
            for k in kwargs:
                send(kwargs=k, producer=producer)
