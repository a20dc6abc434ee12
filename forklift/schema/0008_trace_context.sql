-- forklift 0008: the W3C trace context of a job's enqueue, for OpenTelemetry.
-- {schema} is replaced by the quoted schema name when the migration is applied.

ALTER TABLE {schema}.jobs
    -- The trace context of the span that enqueued it, as the W3C propagator writes it
    -- ({"traceparent": "00-<trace id>-<span id>-<flags>", "tracestate": "..."}), when the
    -- producer had a tracer provider configured (forklift[otel]); NULL otherwise. Every
    -- attempt's `forklift.run` span is a child of that span: one trace from the producer
    -- to the last retry.
    ADD COLUMN trace_context jsonb;
