-- The batch queries, and the job queries that waiting for a result and cancelling a batch
-- need. Each starts with `-- name: <name>` and a one-line description; when loaded,
-- {schema} becomes the quoted schema name, {done_channel} the channel on which waiters hear
-- that a job or a batch ended and {control_channel} the one that tells workers to stop a
-- job.

-- name: batch_create
-- A new batch, open (sealed: no more jobs will be added, `total` known).
INSERT INTO {schema}.batches (callback, total, sealed_at)
VALUES (%(callback)s::jsonb, %(total)s::integer,
        CASE WHEN %(sealed)s::boolean THEN now() END)
RETURNING id;

-- name: batch_add
-- Count jobs added to an open batch (its one producer adds them), and when; refused
-- once sealed (by its producer, an operator's cancel, or as abandoned) or cancelled.
UPDATE {schema}.batches SET total = total + %(n)s::integer, added_at = now()
WHERE id = %(id)s::bigint AND sealed_at IS NULL AND cancelled_at IS NULL
RETURNING id;

-- name: batch_seal
-- No more jobs for this batch: from now on it may finish.
UPDATE {schema}.batches SET sealed_at = now()
WHERE id = %(id)s::bigint AND sealed_at IS NULL;

-- name: batch_done_among
-- Which of these batches look finished: sealed, not marked finished, and no job of theirs
-- ready or running. Unlocked: run after the commit of a job's end, it sees every end
-- committed before it, so the last job's end always sees its batch done. The ready
-- probe reads the batch's ready index backwards from its highest id (the jobs claimed
-- last), where a ready job is found first while any is left; the running probe looks
-- among the running jobs (of every batch: as many as workers run at once).
SELECT b.id FROM {schema}.batches AS b
WHERE b.id = ANY(%(ids)s::bigint[]) AND b.sealed_at IS NOT NULL AND b.finished_at IS NULL
  AND (SELECT j.id FROM {schema}.jobs AS j
       WHERE j.batch_id = b.id AND j.state = 'ready' ORDER BY j.id DESC LIMIT 1) IS NULL
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs AS j
                  WHERE j.state = 'running' AND j.batch_id = b.id);

-- name: batch_lock_open
-- Lock a sealed batch that is not finished (its finisher, or an operator's retry of one
-- of its jobs, holds this until commit).
SELECT b.id FROM {schema}.batches AS b
WHERE b.id = %(id)s::bigint AND b.sealed_at IS NOT NULL AND b.finished_at IS NULL
FOR UPDATE;

-- name: batch_finish
-- Finish a batch locked by batch_lock_open if (seen after the lock) none of its jobs is
-- open: set its outcome, enqueue its callback (once: the reserved key says which batch),
-- tell its waiters. Returns the outcome, the callback's job id and the seconds since the
-- batch's last job ended; no row: still open.
WITH open AS (
    SELECT EXISTS (SELECT 1 FROM {schema}.jobs AS j
                   WHERE j.batch_id = %(id)s::bigint AND j.state = 'ready')
        OR EXISTS (SELECT 1 FROM {schema}.jobs AS j
                   WHERE j.state = 'running' AND j.batch_id = %(id)s::bigint) AS any
), b AS (
    SELECT b.*, EXISTS (SELECT 1 FROM {schema}.jobs AS j
                        WHERE j.batch_id = b.id AND j.state = 'dead') AS failed
    FROM {schema}.batches AS b, open
    WHERE b.id = %(id)s::bigint AND b.finished_at IS NULL AND NOT open.any
), callback AS (
    INSERT INTO {schema}.jobs ({_job_columns}, idempotency_key)
    SELECT {_job_columns}, 'forklift:batch:' || b.id
    FROM b, jsonb_populate_record(NULL::{schema}.jobs, b.callback) AS j
    WHERE b.callback IS NOT NULL
    ON CONFLICT (idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING id
), finished AS (
    UPDATE {schema}.batches AS t SET
        finished_at = now(),
        outcome = CASE WHEN b.cancelled_at IS NOT NULL THEN 'cancelled'
                       WHEN b.abandoned_at IS NOT NULL THEN 'abandoned'
                       WHEN b.failed THEN 'failed' ELSE 'succeeded' END,
        callback_job_id = (SELECT id FROM callback)
    FROM b
    WHERE t.id = b.id
    RETURNING t.id, t.outcome, t.callback_job_id
)
SELECT outcome, callback_job_id, pg_notify('{done_channel}', 'b' || id) IS NULL AS told,
       extract(epoch FROM now() - (SELECT max(j.completed_at) FROM {schema}.jobs AS j
                                   WHERE j.batch_id = finished.id
                                     AND j.state IN ('succeeded', 'dead', 'cancelled')))::float8
           AS delay
FROM finished;

-- name: batch_abandon
-- Seal, as abandoned, batches still filling `after` seconds after their last enqueue
-- (their producer died inside its batch block), a bounded batch at a time through the
-- filling batches' index; one whose producer is adding jobs now (its row locked) is
-- skipped, and its add, seen after, keeps it. They finish as any sealed batch does.
UPDATE {schema}.batches SET sealed_at = now(), abandoned_at = now()
WHERE id IN (
    SELECT b.id FROM {schema}.batches AS b
    WHERE b.sealed_at IS NULL AND b.added_at < now() - make_interval(secs => %(after)s::float8)
    ORDER BY b.added_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
)
RETURNING id;

-- name: batch_sweep
-- Open sealed batches after `after`, oldest first: what the sweep looks at this round.
SELECT b.id FROM {schema}.batches AS b
WHERE b.finished_at IS NULL AND b.sealed_at IS NOT NULL AND b.id > %(after)s::bigint
ORDER BY b.id
LIMIT %(limit)s;

-- name: _batch_row
-- A fragment, not a query: the columns of batch `b` as BatchRow reads them, with the
-- state of its callback's job (by primary key; none before the batch finished) and the
-- database's clock.
b.id, b.total, b.callback->>'task' AS callback_task, b.callback_job_id, b.outcome,
b.created_at, b.sealed_at, b.cancelled_at, b.cancelled_by, b.finished_at, now() AS now,
(SELECT j.state::text FROM {schema}.jobs AS j WHERE j.id = b.callback_job_id)
    AS callback_state,
b.abandoned_at

-- name: batch_get
-- One batch: its row, and the database's clock.
SELECT {_batch_row}
FROM {schema}.batches AS b
WHERE b.id = %(id)s::bigint;

-- name: batch_list_open
-- The batches not finished yet, newest first, through the open-batches index.
SELECT {_batch_row}
FROM {schema}.batches AS b
WHERE b.finished_at IS NULL
ORDER BY b.id DESC
LIMIT %(limit)s;

-- name: batch_list_finished
-- The batches finished most recently, through the finished-batches index.
SELECT {_batch_row}
FROM {schema}.batches AS b
WHERE b.finished_at IS NOT NULL
ORDER BY b.finished_at DESC
LIMIT %(limit)s;

-- name: batch_callback
-- A batch's callback as its row keeps it (JSON text: queue, task, args, priority,
-- max_attempts, max_crashes, timeout); NULL: it has none.
SELECT b.callback::text FROM {schema}.batches AS b
WHERE b.id = %(id)s::bigint;

-- name: batch_counts
-- How many of a batch's jobs are in each state, the progress its running jobs report
-- (summed), and when its latest job ended: ready and finished through its indexes,
-- running among the running jobs.
SELECT 'ready' AS state, count(*) AS n, 0::float8 AS done, 0::float8 AS total,
       NULL::timestamptz AS last_ended
FROM {schema}.jobs AS j
WHERE j.batch_id = %(id)s::bigint AND j.state = 'ready'
UNION ALL
SELECT 'running', count(*),
       coalesce(sum((j.progress->>'done')::float8)
                FILTER (WHERE jsonb_typeof(j.progress->'done') = 'number'), 0),
       coalesce(sum((j.progress->>'total')::float8)
                FILTER (WHERE jsonb_typeof(j.progress->'total') = 'number'), 0),
       NULL::timestamptz
FROM {schema}.jobs AS j
WHERE j.state = 'running' AND j.batch_id = %(id)s::bigint
UNION ALL
SELECT j.state::text, count(*), 0::float8, 0::float8, max(j.completed_at)
FROM {schema}.jobs AS j
WHERE j.batch_id = %(id)s::bigint AND j.state IN ('succeeded', 'dead', 'cancelled')
GROUP BY j.state;

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

-- name: batch_job_ids
-- A page of a batch's job ids, in id order (each state's part through its index).
SELECT id FROM (
    (SELECT j.id FROM {schema}.jobs AS j
     WHERE j.batch_id = %(id)s::bigint AND j.state = 'ready' AND j.id > %(after)s::bigint
     ORDER BY j.id LIMIT %(limit)s)
    UNION ALL
    (SELECT j.id FROM {schema}.jobs AS j
     WHERE j.state = 'running' AND j.batch_id = %(id)s::bigint AND j.id > %(after)s::bigint
     ORDER BY j.id LIMIT %(limit)s)
    UNION ALL
    (SELECT j.id FROM {schema}.jobs AS j
     WHERE j.batch_id = %(id)s::bigint AND j.state IN ('succeeded', 'dead', 'cancelled')
       AND j.id > %(after)s::bigint
     ORDER BY j.id LIMIT %(limit)s)
) AS page
ORDER BY id
LIMIT %(limit)s;

-- name: batch_results
-- A page of a batch's succeeded jobs and their results (JSON text), in id order.
SELECT j.id, j.result::text AS result FROM {schema}.jobs AS j
WHERE j.batch_id = %(id)s::bigint AND j.state = 'succeeded' AND j.id > %(after)s::bigint
ORDER BY j.id
LIMIT %(limit)s;

-- name: batch_dead
-- A page of a batch's dead jobs and their last errors, in id order.
SELECT j.id, j.last_error FROM {schema}.jobs AS j
WHERE j.batch_id = %(id)s::bigint AND j.state = 'dead' AND j.id > %(after)s::bigint
ORDER BY j.id
LIMIT %(limit)s;

-- name: batch_cancel
-- Mark a batch cancelled (who, when) and seal it (a batch still filling, its producer
-- gone, may then finish); its ready and running jobs are cancelled apart.
UPDATE {schema}.batches SET cancelled_at = now(), cancelled_by = %(by)s::text,
                            sealed_at = coalesce(sealed_at, now())
WHERE id = %(id)s::bigint AND cancelled_at IS NULL AND finished_at IS NULL
RETURNING id;

-- name: batch_open_jobs
-- A page of a batch's ready and running job ids, in id order (to cancel them).
SELECT id FROM (
    (SELECT j.id FROM {schema}.jobs AS j
     WHERE j.batch_id = %(id)s::bigint AND j.state = 'ready' AND j.id > %(after)s::bigint
     ORDER BY j.id LIMIT %(limit)s)
    UNION ALL
    (SELECT j.id FROM {schema}.jobs AS j
     WHERE j.state = 'running' AND j.batch_id = %(id)s::bigint AND j.id > %(after)s::bigint
     ORDER BY j.id LIMIT %(limit)s)
) AS page
ORDER BY id
LIMIT %(limit)s;

-- name: job_cancel_many
-- Cancel blocked, ready and running jobs at once, noted in the error history. A running job's
-- lease is taken from its worker, so the owner fence refuses whatever that worker would
-- record next (completion, failure, release: its effect rolls back); the worker is told
-- on the control channel, and the job's waiters (app.result()) on theirs. Its handler
-- may run on until it heeds the cancel or is killed (--cancel-grace), so the lease moves
-- to the job's hold (`stopping_owner`, `stopping_until`: migration 0013), which keeps
-- its limits' slots taken until the worker says the handler stopped or is found dead.
-- Returns every job found with its state and owner before, whether it was cancelled,
-- and its batch.
WITH old AS (
    SELECT j.id, j.state, j.attempts, j.lease_owner, j.batch_id FROM {schema}.jobs AS j
    WHERE j.id = ANY(%(ids)s::bigint[])
    ORDER BY j.id
    FOR UPDATE
), cancelled AS (
    UPDATE {schema}.jobs AS j SET
        state = 'cancelled', completed_at = now(), lease_owner = NULL, lease_until = NULL,
        checkpoint = NULL, checkpoint_at = NULL,  -- a cancelled job does not resume
        stopping_owner = CASE WHEN old.state = 'running' THEN old.lease_owner END,
        stopping_until = CASE WHEN old.state = 'running' THEN j.lease_until END,
        last_error = 'Cancelled by ' || %(by)s::text,
        errors = j.errors || jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'worker', old.lease_owner,
            'error', 'Cancelled by ' || %(by)s::text
                || CASE WHEN old.state = 'running' THEN ' while it ran' ELSE '' END)
    FROM old
    WHERE j.id = old.id AND old.state IN ('blocked', 'ready', 'running')
    RETURNING j.id, j.waited
), told AS (
    SELECT count(pg_notify('{control_channel}', 'cancel ' || old.id || ' ' || old.attempts)) AS n
    FROM old
    WHERE old.state = 'running' AND old.id IN (SELECT id FROM cancelled)
), waiters AS (
    SELECT count(pg_notify('{done_channel}', 'j' || c.id)) AS n FROM cancelled AS c WHERE c.waited
)
SELECT old.id, old.state::text AS was, old.lease_owner AS owner,
       old.id IN (SELECT id FROM cancelled) AS done, old.batch_id
FROM old, told, waiters
ORDER BY old.id;

-- name: batch_prune
-- Delete finished batches past the retention of finished jobs, a bounded batch at a time;
-- one whose callback has not finished stays (batch_holds: it reads the batch's row).
DELETE FROM {schema}.batches
WHERE id IN (
    SELECT b.id FROM {schema}.batches AS b
    WHERE b.finished_at < now() - make_interval(secs => %(keep)s::float8)
      AND NOT {schema}.batch_holds(b.id)
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
);

-- name: job_outcome
-- A job's state, result (JSON text) and last error.
SELECT j.state::text AS state, j.result::text AS result, j.last_error FROM {schema}.jobs AS j
WHERE j.id = %(id)s::bigint;

-- name: job_wait_mark
-- Someone waits for this job: its end will notify the waiters' channel.
UPDATE {schema}.jobs SET waited = true
WHERE id = %(id)s::bigint AND state IN ('ready', 'running') AND NOT waited;

-- name: done_listen
-- Hear that jobs and batches ended ('j<id>', 'b<id>'): hints, each checked in the tables.
LISTEN "{done_channel}";
