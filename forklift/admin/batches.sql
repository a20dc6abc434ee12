-- The operator's batch queries (forklift batches list|show), beside the batch store's own
-- (store/batches.sql: one batch's row, its counts, its open jobs, cancel). Each starts
-- with `-- name: <name>` and a one-line description; {schema} becomes the quoted schema
-- name. Rows of a batch have the columns of store/batches.sql's batch_get (a BatchRow).

-- name: batch_list_open
-- The batches not finished yet, newest first, through the open-batches index.
SELECT b.id, b.total, b.callback->>'task', b.callback_job_id, b.outcome, b.created_at,
       b.sealed_at, b.cancelled_at, b.cancelled_by, b.finished_at, now(), NULL::text
FROM {schema}.batches AS b
WHERE b.finished_at IS NULL
ORDER BY b.id DESC
LIMIT %(limit)s;

-- name: batch_list_finished
-- The batches finished most recently, through the finished-batches index, with the
-- state of each one's callback job (by primary key).
SELECT b.id, b.total, b.callback->>'task', b.callback_job_id, b.outcome, b.created_at,
       b.sealed_at, b.cancelled_at, b.cancelled_by, b.finished_at, now(),
       (SELECT j.state::text FROM {schema}.jobs AS j WHERE j.id = b.callback_job_id)
FROM {schema}.batches AS b
WHERE b.finished_at IS NOT NULL
ORDER BY b.finished_at DESC
LIMIT %(limit)s;

-- name: batch_callback
-- A batch's callback as its row keeps it (JSON text: queue, task, args, priority,
-- max_attempts, max_crashes, timeout); NULL: it has none.
SELECT b.callback::text FROM {schema}.batches AS b
WHERE b.id = %(id)s::bigint;
