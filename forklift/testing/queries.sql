-- The testing helpers' queries (forklift.testing: drain, enqueued, assert_enqueued). Each
-- starts with `-- name: <name>` and a one-line description; {schema} becomes the quoted
-- schema name. They run in an app's tests, on the few jobs a test makes, never on a
-- worker's path: they read the ready jobs without the claim's indexes in mind.

-- name: job_enqueued_list
-- The ready jobs (due now, or later: delayed, or retrying after a backoff) of `task` and
-- `queue` (NULL: any) whose arguments hold every top-level key of `args` with an equal
-- value, oldest first, at most `limit`; `total`: how many match in all.
SELECT j.id, j.task, j.queue, j.args, j.priority, j.attempts, j.max_attempts,
       j.idempotency_key, j.available_at,
       greatest(0, extract(epoch FROM j.available_at - now()))::float8 AS due_in,
       count(*) OVER () AS total
FROM {schema}.jobs AS j
WHERE j.state = 'ready'
  AND (%(task)s::text IS NULL OR j.task = %(task)s::text)
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_each(%(args)s::jsonb) AS e(key, value)
      WHERE j.args -> e.key IS DISTINCT FROM e.value
  )
ORDER BY j.id
LIMIT %(limit)s;

-- name: job_enqueued_sample
-- A few ready jobs of any task, those of `task` first, then oldest first; `total`: how
-- many are ready in all (what a failed assertion shows of the queue).
SELECT j.id, j.task, j.queue, j.args, j.priority, j.attempts, j.max_attempts,
       j.idempotency_key, j.available_at,
       greatest(0, extract(epoch FROM j.available_at - now()))::float8 AS due_in,
       count(*) OVER () AS total
FROM {schema}.jobs AS j
WHERE j.state = 'ready'
ORDER BY j.task IS DISTINCT FROM %(task)s::text, j.id
LIMIT %(limit)s;

-- name: job_due_queues
-- The queues that hold jobs ready and due now (only `queue`, if not NULL): what a drain
-- has its worker claim from.
SELECT DISTINCT j.queue FROM {schema}.jobs AS j
WHERE j.state = 'ready' AND j.available_at <= now()
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
ORDER BY j.queue;

-- name: job_due_count
-- How many jobs are ready and due now (in `queue`, if not NULL): what a drain left.
SELECT count(*) FROM {schema}.jobs AS j
WHERE j.state = 'ready' AND j.available_at <= now()
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text);

-- name: job_make_due
-- The ready jobs due later (delayed, or retrying after a backoff) due now, in `queue` if
-- not NULL: a drain's `with_scheduled`. Their ids.
UPDATE {schema}.jobs AS j SET available_at = now()
WHERE j.state = 'ready' AND j.available_at > now()
  AND (%(queue)s::text IS NULL OR j.queue = %(queue)s::text)
RETURNING j.id;

-- name: job_ends
-- How the jobs `ids` stand after a drain: their state, result and error history.
SELECT j.id, j.state::text AS state, j.result, j.errors
FROM {schema}.jobs AS j
WHERE j.id = ANY(%(ids)s::bigint[]);
