"""OpenTelemetry across the process boundary: a producer's span, its enqueue spans (the
SDK's in-memory exporter), and the `forklift.run` spans of a real `forklift run`'s
children (tests/apps/traced.py exports them to a file): one trace per job, retries in
it; and without a tracer provider, opentelemetry is never imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from forklift.testing import wait_for

# The producer, in a process of its own (a tracer provider is global and set once):
# a "handle request" span around three enqueues, its spans printed as JSON lines.
PRODUCER = """
import json, os, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
import forklift

memory = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(memory))
trace.set_tracer_provider(provider)
app = forklift.App()
with trace.get_tracer("producer").start_as_current_span("handle request"):
    ids = {
        "render": app.enqueue("render", {"tile": 7}),
        "fetch": app.enqueue("fetch", {"url": "https://example.invalid/"}),
        "flaky": app.enqueue("flaky", {}, max_attempts=3),
    }
print(json.dumps(ids))
for span in memory.get_finished_spans():
    print(span.to_json(indent=None))
"""

# A worker with no tracer provider (and, "blocked", no opentelemetry at all) runs a plain
# and an async job; it prints which opentelemetry modules it imported.
UNTRACED = """
import asyncio, importlib.abc, json, sys, threading
if sys.argv[1] == "blocked":
    class Blocked(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] == "opentelemetry":
                raise ImportError(f"{name} is not installed here")
            return None
    sys.meta_path.insert(0, Blocked())
import forklift
from forklift.workers import Worker, WorkerConfig

app = forklift.App()

@app.task(name="plain")
def plain(ctx):
    return 1

@app.task(name="coro")
async def coro(ctx):
    await asyncio.sleep(0)
    return 2

ids = [app.enqueue("plain"), app.enqueue("coro"), app.enqueue_many([("plain", {})])[0]]
worker = Worker(app, WorkerConfig(concurrency=2, maintenance=False))
thread = threading.Thread(target=worker.run)
thread.start()
results = [app.result(i, timeout=30) for i in ids]
worker.request_stop()
thread.join(30)
print(json.dumps({"results": results,
                  "imported": sorted(m for m in sys.modules if m.startswith("opentelemetry"))}))
"""


def spans_of(lines: list[str]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines if line.startswith("{") and '"name"' in line]


def tree(spans: list[dict[str, Any]]) -> str:
    """The spans as an indented tree with their forklift attributes (for the report)."""
    children: dict[str | None, list[dict[str, Any]]] = {}
    ids = {s["context"]["span_id"] for s in spans}
    for span in sorted(spans, key=lambda s: s["start_time"]):
        parent = span["parent_id"] if span["parent_id"] in ids else None
        children.setdefault(parent, []).append(span)

    def lines(parent: str | None, depth: int) -> list[str]:
        out = []
        for span in children.get(parent, []):
            attrs = {k: v for k, v in span["attributes"].items() if k.startswith("forklift.")}
            status = span["status"]["status_code"]
            events = [e["attributes"].get("exception.type") for e in span["events"]]
            extra = f" status={status}" + (f" exception={events}" if events else "")
            out.append(f"{'  ' * depth}{span['name']} {attrs}{extra}")
            out += lines(span["context"]["span_id"], depth + 1)
        return out

    return "\n".join(lines(None, 0))


def test_one_trace_from_a_producers_span_through_enqueue_to_the_handlers_spans(
    env: dict[str, str], tmp_path: Path, forklift_cli: Any
) -> None:
    spans_file = tmp_path / "spans.jsonl"
    env["FORKLIFT_TEST_SPANS"] = str(spans_file)
    produced = subprocess.run(
        [sys.executable, "-c", PRODUCER], env=env, capture_output=True, text=True, timeout=60
    )
    assert produced.returncode == 0, produced.stderr
    first, *rest = produced.stdout.splitlines()
    ids: dict[str, int] = json.loads(first)
    producer = spans_of(rest)
    sup = forklift_cli("run", "tests.apps.traced:app", "--workers", "1", "--concurrency", "2")

    def worker_spans() -> list[dict[str, Any]] | None:
        found = spans_of(spans_file.read_text().splitlines()) if spans_file.exists() else []
        return found if len(found) >= 6 else None  # 4 runs, 2 of the handlers' own

    runs: list[dict[str, Any]] = wait_for(worker_spans, timeout=30, what="the workers' spans")
    every = producer + runs
    print("\n" + tree(every))
    by_name = {s["name"]: s for s in producer}
    request = by_name["handle request"]
    trace_id = request["context"]["trace_id"]
    for task in ("render", "fetch"):
        enqueue = by_name[f"forklift.enqueue {task}"]
        assert enqueue["parent_id"] == request["context"]["span_id"]
        assert enqueue["attributes"]["forklift.job.id"] == ids[task]
        (run,) = [s for s in runs if s["name"] == f"forklift.run {task}"]
        assert run["context"]["trace_id"] == trace_id
        assert run["parent_id"] == enqueue["context"]["span_id"]
        assert run["kind"] == "SpanKind.CONSUMER"
        attrs = run["attributes"]
        assert (attrs["forklift.job.id"], attrs["forklift.queue"]) == (ids[task], "default")
        assert (attrs["forklift.job.attempt"], attrs["forklift.outcome"]) == (1, "succeeded")
        inner = "render tile" if task == "render" else "fetch url"
        (handler,) = [s for s in runs if s["name"] == inner]
        assert handler["parent_id"] == run["context"]["span_id"]  # the handler's own span
    # A retry: both attempts' spans in the producer's trace, children of its enqueue;
    # the failed one carries the error and its exception.
    enqueue = by_name["forklift.enqueue flaky"]
    attempts = sorted(
        (s for s in runs if s["name"] == "forklift.run flaky"),
        key=lambda s: s["attributes"]["forklift.job.attempt"],
    )
    assert [s["attributes"]["forklift.outcome"] for s in attempts] == ["failed", "succeeded"]
    for span in attempts:
        assert span["context"]["trace_id"] == trace_id
        assert span["parent_id"] == enqueue["context"]["span_id"]
    failed = attempts[0]
    assert failed["status"]["status_code"] == "ERROR"
    assert failed["status"]["description"] == "RuntimeError: the first attempt fails"
    (event,) = failed["events"]
    assert event["name"] == "exception"
    assert event["attributes"]["exception.type"] == "RuntimeError"
    assert attempts[1]["status"]["status_code"] == "UNSET"
    sup.stop_cleanly()


@pytest.mark.parametrize("opentelemetry", ["installed", "blocked"])
def test_without_a_tracer_provider_nothing_imports_opentelemetry(
    env: dict[str, str], opentelemetry: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-c", UNTRACED, opentelemetry],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.splitlines()[-1])
    assert found == {"results": [1, 2, 1], "imported": []}
