-- Operator queries (status, ps, queues, metrics gauges). Each starts with `-- name: <name>` and
-- a one-line description; {schema} is replaced by the quoted schema name when loaded.

-- name: queue_depth
-- Per queue: due, scheduled, running and dead jobs, and the oldest due job's age (NULL:
-- nothing due).
SELECT queue,
       count(*) FILTER (WHERE state = 'ready' AND available_at <= now()),
       count(*) FILTER (WHERE state = 'ready' AND available_at > now()),
       count(*) FILTER (WHERE state = 'running'),
       count(*) FILTER (WHERE state = 'dead'),
       extract(epoch FROM now() - min(available_at)
           FILTER (WHERE state = 'ready' AND available_at <= now()))::float8
FROM {schema}.jobs
WHERE state IN ('ready', 'running', 'dead')
GROUP BY queue
ORDER BY queue;

-- name: queue_throughput
-- Per queue: jobs that succeeded and that went dead in the last minute and hour (a scan
-- of the last hour's finished jobs, through the finished-jobs index).
SELECT queue,
       count(*) FILTER (WHERE state = 'succeeded' AND completed_at > now() - interval '1 minute'),
       count(*) FILTER (WHERE state = 'dead' AND completed_at > now() - interval '1 minute'),
       count(*) FILTER (WHERE state = 'succeeded'),
       count(*) FILTER (WHERE state = 'dead')
FROM {schema}.jobs
WHERE state IN ('succeeded', 'dead', 'cancelled') AND completed_at > now() - interval '1 hour'
GROUP BY queue;

-- name: process_list
-- Every registered process, with its heartbeat age and uptime in seconds.
SELECT id, kind, host, pid, supervisor_id, queues, current_job, rss_bytes,
       extract(epoch FROM now() - started_at)::float8 AS uptime,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age
FROM {schema}.processes
ORDER BY host, coalesce(supervisor_id, id), kind = 'supervisor' DESC, pid;

-- name: queue_paused_list
-- Every paused queue: since when (and seconds ago), and by whom.
SELECT queue, paused_at, extract(epoch FROM now() - paused_at)::float8, paused_by
FROM {schema}.paused_queues
ORDER BY queue;

-- name: queue_pause
-- Pause a queue (no worker claims from it until it is resumed); returns nothing if it
-- was paused already.
INSERT INTO {schema}.paused_queues (queue, paused_by)
VALUES (%(queue)s::text, %(by)s::text)
ON CONFLICT (queue) DO NOTHING
RETURNING queue;

-- name: queue_resume
-- Resume a paused queue and wake the workers that serve it; returns nothing if it was
-- not paused.
WITH resumed AS (
    DELETE FROM {schema}.paused_queues WHERE queue = %(queue)s::text RETURNING queue
)
SELECT queue, pg_notify('{channel}', queue) IS NULL FROM resumed;

-- name: ping
-- Is the database there, with forklift's tables in it? (NULL: not migrated)
SELECT to_regclass('{schema}.jobs');
