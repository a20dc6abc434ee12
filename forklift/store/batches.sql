-- The batch queries. Each starts with `-- name: <name>` and a one-line description; when
-- loaded, {schema} becomes the quoted schema name and {done_channel} the channel on which
-- waiters hear that a batch ended.

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
SELECT outcome, callback_job_id, pg_notify('{done_channel}', 'b' || id) IS NULL,
       extract(epoch FROM now() - (SELECT max(j.completed_at) FROM {schema}.jobs AS j
                                   WHERE j.batch_id = finished.id
                                     AND j.state IN ('succeeded', 'dead', 'cancelled')))::float8
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

-- name: batch_get
-- One batch: its row, and the database's clock.
SELECT b.id, b.total, b.callback->>'task', b.callback_job_id, b.outcome, b.created_at,
       b.sealed_at, b.cancelled_at, b.cancelled_by, b.finished_at, now(),
       (SELECT j.state::text FROM {schema}.jobs AS j WHERE j.id = b.callback_job_id),
       b.abandoned_at
FROM {schema}.batches AS b
WHERE b.id = %(id)s::bigint;

-- name: batch_counts
-- How many of a batch's jobs are in each state, the progress its running jobs report
-- (summed), and when its latest job ended: ready and finished through its indexes,
-- running among the running jobs.
SELECT 'ready', count(*), 0::float8, 0::float8, NULL::timestamptz FROM {schema}.jobs AS j
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
SELECT j.id, j.result::text FROM {schema}.jobs AS j
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
SELECT j.state::text, j.result::text, j.last_error FROM {schema}.jobs AS j
WHERE j.id = %(id)s::bigint;

-- name: job_wait_mark
-- Someone waits for this job: its end will notify the waiters' channel.
UPDATE {schema}.jobs SET waited = true
WHERE id = %(id)s::bigint AND state IN ('ready', 'running') AND NOT waited;

-- name: done_listen
-- Hear that jobs and batches ended ('j<id>', 'b<id>'): hints, each checked in the tables.
LISTEN "{done_channel}";
