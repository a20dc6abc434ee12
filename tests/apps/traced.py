"""A traced test app: its tracer provider (the OpenTelemetry SDK) exports every span it
ends as one JSON line, appended to the file $FORKLIFT_TEST_SPANS, so a test reads the
spans of a real `forklift run`'s children (tests/acceptance/test_tracing.py)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

import forklift


class FileExporter(SpanExporter):
    """One JSON line per span, appended with one write (lines of processes never mix)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        text = "".join(span.to_json(indent=None) + "\n" for span in spans)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, text.encode())
        finally:
            os.close(fd)
        return SpanExportResult.SUCCESS


provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(FileExporter(os.environ["FORKLIFT_TEST_SPANS"])))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("tests.apps.traced")

app = forklift.App()


@app.task(name="render")
def render(ctx: forklift.JobContext, *, tile: int) -> int:
    with tracer.start_as_current_span("render tile"):
        return tile * 2


@app.task(name="fetch")
async def fetch(ctx: forklift.AsyncJobContext, *, url: str) -> str:
    with tracer.start_as_current_span("fetch url"):
        await asyncio.sleep(0.01)
        return url


@app.task(name="flaky", max_attempts=3, backoff=forklift.Backoff(base=0.1, max=0.1, jitter=0))
def flaky(ctx: forklift.JobContext) -> str:
    if ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return "second time lucky"
