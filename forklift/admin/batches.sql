-- The operator's batch queries (forklift batches list|show), beside the batch store's own
-- (store/batches.sql: one batch's row, its counts, its open jobs, cancel). Each starts
-- with `-- name: <name>` and a one-line description; {schema} becomes the quoted schema
-- name. Rows of a batch have the columns of store/batches.sql's batch_get (a BatchRow).

-- name: batch_list_open
-- The batches not finished yet, newest first, through the open-batches index.
SELECT b.id, b.total, b.callback->>'task', b.callback_job_id, b.outcome, b.created_at,
       b.sealed_at, b.cancelled_at, b.cancelled_by, b.finished_at, now(), NULL::text,
       b.abandoned_at
FROM {schema}.batches AS b
WHERE b.finished_at IS NULL
ORDER BY b.id DESC
LIMIT %(limit)s;

-- name: batch_list_finished
-- The batches finished most recently, through the finished-batches index, with the
-- state of each one's callback job (by primary key).
SELECT b.id, b.total, b.callback->>'task', b.callback_job_id, b.outcome, b.created_at,
       b.sealed_at, b.cancelled_at, b.cancelled_by, b.finished_at, now(),
       (SELECT j.state::text FROM {schema}.jobs AS j WHERE j.id = b.callback_job_id),
       b.abandoned_at
FROM {schema}.batches AS b
WHERE b.finished_at IS NOT NULL
ORDER BY b.finished_at DESC
LIMIT %(limit)s;

-- name: batch_callback
-- A batch's callback as its row keeps it (JSON text: queue, task, args, priority,
-- max_attempts, max_crashes, timeout); NULL: it has none.
SELECT b.callback::text FROM {schema}.batches AS b
WHERE b.id = %(id)s::bigint;

-- name: batch_tally_many
-- These batches' jobs by state without reading one row per job that succeeded: ready ones
-- through the batch's ready index, running ones among the running jobs (with the progress
-- they report, summed), dead and cancelled ones from their own index alone (migration
-- 0009); the succeeded are what a batch's total leaves. One row per batch and state.
SELECT b.id, t.state, t.n, t.done, t.total
FROM unnest(%(ids)s::bigint[]) AS b(id)
CROSS JOIN LATERAL (
    SELECT 'ready' AS state, count(*) AS n, 0::float8 AS done, 0::float8 AS total
    FROM {schema}.jobs AS j
    WHERE j.batch_id = b.id AND j.state = 'ready'
    UNION ALL
    SELECT 'running', count(*),
           coalesce(sum((j.progress->>'done')::float8)
                    FILTER (WHERE jsonb_typeof(j.progress->'done') = 'number'), 0),
           coalesce(sum((j.progress->>'total')::float8)
                    FILTER (WHERE jsonb_typeof(j.progress->'total') = 'number'), 0)
    FROM {schema}.jobs AS j
    WHERE j.state = 'running' AND j.batch_id = b.id
    UNION ALL
    SELECT j.state::text, count(*), 0::float8, 0::float8
    FROM {schema}.jobs AS j
    WHERE j.batch_id = b.id AND j.state IN ('dead', 'cancelled')
    GROUP BY j.state
) AS t;
