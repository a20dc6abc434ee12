-- The supervisor's queries. Each starts with `-- name: <name>` and a one-line
-- description; {schema} is replaced by the quoted schema name when loaded.

-- name: job_fail_orphaned
-- Record a dead (or killed) worker process on the jobs it held: ready again after a
-- short backoff, or dead when attempts are exhausted. Fenced by the dead owner.
UPDATE {schema}.jobs AS j SET
    state = CASE WHEN j.attempts >= j.max_attempts
        THEN 'dead' ELSE 'ready' END::{schema}.job_state,
    available_at = CASE WHEN j.attempts >= j.max_attempts THEN j.available_at
        ELSE now() + make_interval(
            secs => least(%(backoff_max)s::float8,
                          %(backoff_base)s::float8 * power(2, greatest(j.attempts - 1, 0))))
        END,
    completed_at = CASE WHEN j.attempts >= j.max_attempts THEN now() END,
    lease_owner = NULL,
    lease_until = NULL,
    last_error = %(error)s::text,
    errors = j.errors || jsonb_build_object(
        'attempt', j.attempts, 'at', now(), 'worker', j.lease_owner, 'error', %(error)s::text)
WHERE j.state = 'running' AND j.lease_owner = %(owner)s::text
  AND (%(ids)s::bigint[] IS NULL OR j.id = ANY(%(ids)s::bigint[]))
RETURNING j.id, j.state::text, j.attempts;

-- name: job_release_owner
-- Give back every job a stopped worker process still holds, attempt not counted.
WITH released AS (
    UPDATE {schema}.jobs AS j SET
        state = 'ready', attempts = greatest(j.attempts - 1, 0), available_at = now(),
        lease_owner = NULL, lease_until = NULL
    WHERE j.state = 'running' AND j.lease_owner = %(owner)s::text
    RETURNING j.id, j.queue
), woken AS (
    SELECT count(pg_notify(%(channel)s::text, q.queue)) AS n
    FROM (SELECT DISTINCT queue FROM released) AS q
)
SELECT released.id FROM released, woken;

-- name: job_backlog
-- Ready jobs due now in the given queues (capped: autoscaling needs "how many", not all).
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.jobs
    WHERE state = 'ready' AND queue = ANY(%(queues)s::text[]) AND available_at <= now()
    LIMIT %(cap)s
) AS due;
