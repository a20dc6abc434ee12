-- Operator queries (status, ps, metrics gauges). Each starts with `-- name: <name>` and
-- a one-line description; {schema} is replaced by the quoted schema name when loaded.

-- name: queue_stats
-- Per queue: due, scheduled, running and dead jobs, oldest due age, successes last minute.
WITH live AS (
    SELECT queue,
           count(*) FILTER (WHERE state = 'ready' AND available_at <= now()) AS ready,
           count(*) FILTER (WHERE state = 'ready' AND available_at > now()) AS scheduled,
           count(*) FILTER (WHERE state = 'running') AS running,
           count(*) FILTER (WHERE state = 'dead') AS dead,
           extract(epoch FROM now() - min(available_at)
               FILTER (WHERE state = 'ready' AND available_at <= now()))::float8 AS oldest
    FROM {schema}.jobs
    WHERE state IN ('ready', 'running', 'dead')
    GROUP BY queue
), recent AS (
    SELECT queue, count(*) AS done
    FROM {schema}.jobs
    WHERE state = 'succeeded' AND completed_at > now() - interval '1 minute'
    GROUP BY queue
)
SELECT coalesce(l.queue, r.queue) AS queue,
       coalesce(l.ready, 0), coalesce(l.scheduled, 0), coalesce(l.running, 0),
       coalesce(l.dead, 0), coalesce(l.oldest, 0), coalesce(r.done, 0)
FROM live AS l FULL JOIN recent AS r ON l.queue = r.queue
ORDER BY 1;

-- name: process_list
-- Every registered process, with its heartbeat age and uptime in seconds.
SELECT id, kind, host, pid, supervisor_id, queues, current_job, rss_bytes,
       extract(epoch FROM now() - started_at)::float8 AS uptime,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age
FROM {schema}.processes
ORDER BY host, coalesce(supervisor_id, id), kind DESC, pid;

-- name: ping
-- Is the database there?
SELECT 1;
