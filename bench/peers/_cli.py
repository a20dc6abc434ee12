"""The command line of the peers' side: `python -m bench.peers PEER COMMAND ...`.

PEER is pgqueuer, procrastinate or celery (the module bench.peers.PEER_peer, imported
by name, never as __main__: procrastinate warns about an app in the main module).

Commands (the DSN in $BENCH_DSN; every result is one JSON object on stdout):

    install                      the peer's tables
    reset                        empty them (and the peer's broker queue)
    uninstall                    remove what the database drop does not (Redis keys)
    enqueue TASK N [--batch B] [--kwargs JSON]
                                 N jobs of TASK in batches of B, the peer's bulk path;
                                 {"seconds": time spent in the enqueue calls}
    enqueue-keys PREFIX N KEYS [--batch B]
                                 (pgqueuer only) N no-op jobs to the entrypoints
                                 PREFIX0 .. PREFIX{KEYS-1} in turn, in batches of B;
                                 {"seconds": ...}
    enqueue-one N                N no-op jobs, one call each (one more first, outside the
                                 clock, opens the connection); {"seconds": ...}
    latency N RATE               5 warm-up jobs, then N "stamp" jobs at RATE/s, each with
                                 the time read just before its call (see bench._stamps)

    work ...                     (pgqueuer only) one worker process, see its module

A peer module has a class `Producer` (this `Producer` protocol), and may have `work`.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from bench import _stamps


class Producer(Protocol):
    """What a peer module provides to this command line; every call is async."""

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def install(self) -> None: ...
    async def reset(self) -> None: ...
    async def uninstall(self) -> None: ...
    async def enqueue(self, task: str, kwargs: dict[str, Any]) -> None: ...
    async def enqueue_many(self, task: str, kwargs: list[dict[str, Any]]) -> None: ...


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.peers PEER", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("install")
    sub.add_parser("reset")
    sub.add_parser("uninstall")
    many = sub.add_parser("enqueue")
    many.add_argument("task")
    many.add_argument("count", type=int)
    many.add_argument("--batch", type=int, default=10_000)
    many.add_argument("--kwargs", type=json.loads, default={})
    keyed = sub.add_parser("enqueue-keys")
    keyed.add_argument("prefix")
    keyed.add_argument("count", type=int)
    keyed.add_argument("keys", type=int)
    keyed.add_argument("--batch", type=int, default=10_000)
    one = sub.add_parser("enqueue-one")
    one.add_argument("count", type=int)
    latency = sub.add_parser("latency")
    latency.add_argument("count", type=int)
    latency.add_argument("rate", type=float)
    return p


async def enqueue_bulk(producer: Producer, args: argparse.Namespace) -> dict[str, float]:
    spent = 0.0
    for done in range(0, args.count, args.batch):
        batch = [args.kwargs] * min(args.batch, args.count - done)
        started = time.perf_counter()
        await producer.enqueue_many(args.task, batch)
        spent += time.perf_counter() - started
    return {"seconds": spent}


async def enqueue_keys(producer: Producer, args: argparse.Namespace) -> dict[str, float]:
    enqueue = getattr(producer, "enqueue_keys", None)
    if enqueue is None:
        raise SystemExit(f"enqueue-keys: {type(producer).__module__} has no keyed entrypoints")
    spent = 0.0
    for done in range(0, args.count, args.batch):
        size = min(args.batch, args.count - done)
        started = time.perf_counter()
        await enqueue(args.prefix, args.keys, done, [{}] * size)
        spent += time.perf_counter() - started
    return {"seconds": spent}


async def enqueue_one_by_one(producer: Producer, count: int) -> dict[str, float]:
    await producer.enqueue("noop", {})  # the connection opened outside the clock
    started = time.perf_counter()
    for _ in range(count):
        await producer.enqueue("noop", {})
    return {"seconds": time.perf_counter() - started}


async def latency(producer: Producer, count: int, rate: float) -> dict[str, float]:
    path = Path(os.environ[_stamps.ENV])
    for key in _stamps.latency_keys(path, count, rate):
        await producer.enqueue("stamp", {"key": key, "t": time.time()})
    return {"sent": count}


async def run(producer: Producer, args: argparse.Namespace) -> dict[str, Any]:
    await producer.open()
    try:
        if args.command == "install":
            await producer.install()
        elif args.command == "reset":
            await producer.reset()
        elif args.command == "uninstall":
            await producer.uninstall()
        elif args.command == "enqueue":
            return await enqueue_bulk(producer, args)
        elif args.command == "enqueue-keys":
            return await enqueue_keys(producer, args)
        elif args.command == "enqueue-one":
            return await enqueue_one_by_one(producer, args.count)
        elif args.command == "latency":
            return await latency(producer, args.count, args.rate)
        return {}
    finally:
        await producer.close()


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m bench.peers PEER COMMAND ... (see bench/peers/_cli.py)")
    module = importlib.import_module(f"bench.peers.{argv[0]}_peer")
    if argv[1:2] == ["work"]:
        module.work(argv[2:])
        return
    result = asyncio.run(run(module.Producer(), build_parser().parse_args(argv[1:])))
    print(json.dumps(result))
    sys.stdout.flush()
