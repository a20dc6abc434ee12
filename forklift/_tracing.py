"""OpenTelemetry traces: a span per enqueue, and a `forklift.run <task>` span per attempt.

Tracing is on when the application has configured a tracer provider (opentelemetry-api,
the `forklift[otel]` extra; the SDK and exporter are the application's choice). forklift
never imports opentelemetry itself: an application that has not imported it has no
provider, and then every function here returns at its first line, so a worker or a
producer without tracing does exactly what it did before.

An enqueue's span stores its W3C trace context with the job (`jobs.trace_context`, a
JSON object `{"traceparent": ..., "tracestate": ...}`); each attempt's run span is its
child, across processes and retries: one trace from the producer's request to the last
attempt. Metrics stay on prometheus-client.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from forklift._version import __version__

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from forklift.store import NewJob
    from forklift.workers.context import JobContext

SCOPE = "forklift"

# Attribute names (OpenTelemetry's messaging conventions where one fits, else forklift.*).
SYSTEM = "messaging.system"
OPERATION = "messaging.operation.type"
DESTINATION = "messaging.destination.name"
MESSAGE_ID = "messaging.message.id"
BATCH_COUNT = "messaging.batch.message_count"
JOB_ID = "forklift.job.id"
TASK = "forklift.task"
QUEUE = "forklift.queue"
ATTEMPT = "forklift.job.attempt"
OUTCOME = "forklift.outcome"

_cached: tuple[object, Tracer] | None = None


def tracer() -> Tracer | None:
    """forklift's tracer, when the application configured a tracer provider; else None
    (and nothing imported: opentelemetry is looked up only if already loaded)."""
    global _cached
    trace = sys.modules.get("opentelemetry.trace")
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None
    if _cached is None or _cached[0] is not provider:
        _cached = (provider, provider.get_tracer(SCOPE, __version__))
    return _cached[1]


# -- producing ---------------------------------------------------------------------------


def enqueuing(jobs: Sequence[NewJob]) -> AbstractContextManager[Span | None]:
    """A producer span around inserting `jobs` (current, so it is the child of the
    caller's span), whose W3C context each job stores; without tracing, none (None)."""
    found = tracer()
    return nullcontext() if found is None else _enqueue_span(found, jobs)


@contextmanager
def _enqueue_span(tracer: Tracer, jobs: Sequence[NewJob]) -> Iterator[Span]:
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    first = jobs[0]
    one = len(jobs) == 1
    name = f"forklift.enqueue {first.task}" if one else "forklift.enqueue_many"
    attributes: dict[str, Any] = {SYSTEM: "forklift", OPERATION: "send"}
    if one:
        attributes |= {TASK: first.task, QUEUE: first.queue, DESTINATION: first.queue}
    else:
        attributes[BATCH_COUNT] = len(jobs)
    with tracer.start_as_current_span(name, kind=SpanKind.PRODUCER, attributes=attributes) as span:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
        text = json.dumps(carrier) if carrier else None
        for job in jobs:
            job.trace_context = text
        yield span


def enqueued(span: Span | None, job_id: int) -> None:
    if span is None:
        return
    span.set_attribute(JOB_ID, job_id)
    span.set_attribute(MESSAGE_ID, str(job_id))


# -- running -----------------------------------------------------------------------------


def start_run(tracer: Tracer, ctx: JobContext) -> None:
    """Start the attempt's `forklift.run <task>` span, the child of its enqueue span (if
    the job carries one), and keep it on the context until its outcome (`end_run`)."""
    from opentelemetry.trace import SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent = None
    if ctx.trace_context:
        parent = TraceContextTextMapPropagator().extract(ctx.trace_context)
    job = ctx.job
    attributes: dict[str, Any] = {
        SYSTEM: "forklift", OPERATION: "process", DESTINATION: job.queue,
        MESSAGE_ID: str(job.id), JOB_ID: job.id, TASK: job.task, QUEUE: job.queue,
        ATTEMPT: job.attempt,
    }  # fmt: skip
    ctx.span = tracer.start_span(
        f"forklift.run {job.task}", context=parent, kind=SpanKind.CONSUMER, attributes=attributes
    )


def activate(ctx: JobContext) -> object | None:
    """Make the run span current while the handler runs (its own spans are children);
    the token to give `deactivate`."""
    if ctx.span is None:
        return None
    from opentelemetry import context, trace

    return context.attach(trace.set_span_in_context(ctx.span))


def deactivate(token: object | None) -> None:
    if token is not None:
        from opentelemetry import context

        context.detach(token)  # type: ignore[arg-type]


def handler_raised(ctx: JobContext, exc: BaseException | None) -> None:
    """Record the handler's exception on the run span (as an `exception` event)."""
    if ctx.span is not None and exc is not None:
        ctx.span.record_exception(exc)


def end_run(ctx: JobContext, outcome: str, error: str | None = None) -> None:
    """End the run span with the attempt's outcome; an error sets its status."""
    span, ctx.span = ctx.span, None
    if span is None:
        return
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute(OUTCOME, outcome)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, error))
    span.end()


def contexts(rows: Sequence[tuple[int, Any]]) -> dict[int, dict[str, str]]:
    """job id -> its stored trace context (job_trace_contexts' rows)."""
    found = {}
    for job_id, value in rows:
        carrier = json.loads(value) if isinstance(value, str) else value
        if isinstance(carrier, dict):
            found[int(job_id)] = {str(k): str(v) for k, v in carrier.items()}
    return found
