-- Operator queries (status, ps, queues, metrics gauges). Each starts with `-- name: <name>` and
-- a one-line description; {schema} is replaced by the quoted schema name when loaded.

-- name: _queues_held
-- A fragment, not a query: four recursive CTEs, `ready`, `limited`, `dead` and `blocked`
-- (workflow jobs waiting for their upstream jobs), each the
-- queues with jobs in that state (a NULL row ends each), found by a loose scan of its
-- partial index: a probe per queue, never every row.
ready(queue) AS (
    (SELECT j.queue FROM {schema}.jobs AS j WHERE j.state = 'ready' AND j.limit_key IS NULL
     ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.queue > r.queue
            ORDER BY j.queue LIMIT 1)
    FROM ready AS r WHERE r.queue IS NOT NULL
), limited(queue) AS (
    (SELECT j.queue FROM {schema}.jobs AS j
     WHERE j.state = 'ready' AND j.limit_key IS NOT NULL ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue > r.queue
            ORDER BY j.queue LIMIT 1)
    FROM limited AS r WHERE r.queue IS NOT NULL
), dead(queue) AS (
    (SELECT j.queue FROM {schema}.jobs AS j WHERE j.state = 'dead' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'dead' AND j.queue > d.queue ORDER BY j.queue LIMIT 1)
    FROM dead AS d WHERE d.queue IS NOT NULL
), blocked(queue) AS (
    (SELECT j.queue FROM {schema}.jobs AS j WHERE j.state = 'blocked' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM {schema}.jobs AS j
            WHERE j.state = 'blocked' AND j.queue > b.queue ORDER BY j.queue LIMIT 1)
    FROM blocked AS b WHERE b.queue IS NOT NULL
)

-- name: queue_depth
-- Per queue: due, scheduled, running and dead jobs, the oldest due job's age (NULL:
-- nothing due), blocked workflow jobs, and `unrunnable`: ready jobs that require labels
-- no registered worker of the queue has every one of (migration 0025), among `cap` of
-- those that require labels, read from jobs_ready_labelled_idx alone. Due, scheduled,
-- dead and blocked are each counted up to `cap` (a count of `cap`
-- means `cap` or more): whatever a queue's backlog or the dead jobs retained, a call
-- reads at most 5 x `cap` index entries a queue. The queues come from a loose scan
-- of each index (a probe per queue), the counts from ranges of the due-time indexes
-- (migration 0011) and of the dead-per-queue index, read from the indexes alone; the
-- running jobs are read whole (as many as the workers have slots). (Each count is in
-- index order: a count under a LIMIT alone is planned as a table scan expected to stop
-- early, which walks every other queue's rows.)
WITH RECURSIVE {_queues_held}, running AS (
    SELECT j.queue, count(*) AS n FROM {schema}.jobs AS j
    WHERE j.state = 'running' GROUP BY j.queue
), queues(queue) AS (
    SELECT queue FROM ready WHERE queue IS NOT NULL
    UNION SELECT queue FROM limited WHERE queue IS NOT NULL
    UNION SELECT queue FROM dead WHERE queue IS NOT NULL
    UNION SELECT queue FROM blocked WHERE queue IS NOT NULL
    UNION SELECT queue FROM running
)
SELECT q.queue,
       least(%(cap)s::integer, (
           SELECT count(*) FROM (SELECT FROM {schema}.jobs AS j
               WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.queue = q.queue
                 AND j.available_at <= now()
               ORDER BY j.available_at LIMIT %(cap)s::integer) AS c) + (
           SELECT count(*) FROM (SELECT FROM {schema}.jobs AS j
               WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.queue
                 AND j.available_at <= now()
               ORDER BY j.available_at LIMIT %(cap)s::integer) AS c)) AS ready,
       least(%(cap)s::integer, (
           SELECT count(*) FROM (SELECT FROM {schema}.jobs AS j
               WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.queue = q.queue
                 AND j.available_at > now()
               ORDER BY j.available_at LIMIT %(cap)s::integer) AS c) + (
           SELECT count(*) FROM (SELECT FROM {schema}.jobs AS j
               WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.queue
                 AND j.available_at > now()
               ORDER BY j.available_at LIMIT %(cap)s::integer) AS c)) AS scheduled,
       coalesce((SELECT r.n FROM running AS r WHERE r.queue = q.queue), 0) AS running,
       (SELECT count(*) FROM (SELECT FROM {schema}.jobs AS j
            WHERE j.state = 'dead' AND j.queue = q.queue LIMIT %(cap)s::integer) AS c) AS dead,
       extract(epoch FROM now() - least(
           (SELECT j.available_at FROM {schema}.jobs AS j
            WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.queue = q.queue
              AND j.available_at <= now() ORDER BY j.available_at LIMIT 1),
           (SELECT j.available_at FROM {schema}.jobs AS j
            WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.queue
              AND j.available_at <= now() ORDER BY j.available_at LIMIT 1)))::float8 AS oldest_ready_age,
       (SELECT count(*) FROM (SELECT FROM {schema}.jobs AS j
            WHERE j.state = 'blocked' AND j.queue = q.queue LIMIT %(cap)s::integer) AS c) AS blocked,
       (SELECT count(*) FROM (SELECT j.requires FROM {schema}.jobs AS j
            WHERE j.state = 'ready' AND j.requires IS NOT NULL AND j.queue = q.queue
            LIMIT %(cap)s::integer) AS w
        WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.processes AS p
            WHERE p.kind = 'worker' AND q.queue = ANY(p.queues)
              AND string_to_array(w.requires, ',') <@ p.labels)) AS unrunnable
FROM queues AS q
ORDER BY q.queue;

-- name: queue_finished
-- Per queue: jobs that succeeded and that went dead in the last `window` seconds, a range
-- of the completion-time index read from the index alone; its cost grows with the jobs
-- finished in the window (the last minute: cheap; the last hour: a rate x 3,600 rows).
SELECT j.queue,
       count(*) FILTER (WHERE j.state = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE j.state = 'dead') AS dead
FROM {schema}.jobs AS j
WHERE j.state IN ('succeeded', 'dead', 'cancelled')
  AND j.completed_at > now() - make_interval(secs => %(window)s::float8)
GROUP BY j.queue;

-- name: process_list
-- Every registered process, with its heartbeat age and uptime in seconds.
SELECT id, kind, host, pid, supervisor_id, queues, current_job, rss_bytes, labels,
       extract(epoch FROM now() - started_at)::float8 AS uptime,
       extract(epoch FROM now() - heartbeat_at)::float8 AS heartbeat_age
FROM {schema}.processes
ORDER BY host, coalesce(supervisor_id, id), kind = 'supervisor' DESC, pid;

-- name: queue_paused_list
-- Every paused queue: since when (and seconds ago), and by whom.
SELECT queue, paused_at, extract(epoch FROM now() - paused_at)::float8 AS paused_for, paused_by
FROM {schema}.paused_queues
ORDER BY queue;

-- name: queue_known_list
-- Every queue in use: with jobs ready (due or not), running or dead, among the newest
-- 10,000 finished jobs, served by a registered process, or paused. One probe of an index
-- per queue for the ready (each of the two claim indexes) and the dead (a loose index
-- scan: never every row), the running jobs' index, the newest finished jobs alone: its
-- cost grows with the queues, not the jobs.
WITH RECURSIVE {_queues_held}
SELECT queue FROM ready WHERE queue IS NOT NULL
UNION
SELECT queue FROM limited WHERE queue IS NOT NULL
UNION
SELECT queue FROM dead WHERE queue IS NOT NULL
UNION
SELECT j.queue FROM {schema}.jobs AS j WHERE j.state = 'running'
UNION
SELECT f.queue FROM (
    SELECT j.queue FROM {schema}.jobs AS j
    WHERE j.state IN ('succeeded', 'dead', 'cancelled')
    ORDER BY j.completed_at DESC
    LIMIT 10000
) AS f
UNION
SELECT unnest(p.queues) FROM {schema}.processes AS p
UNION
SELECT q.queue FROM {schema}.paused_queues AS q
UNION
SELECT l.name FROM {schema}.limits AS l WHERE l.scope = 'queue';

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

-- name: limit_list
-- Every limit in force, the queues' (forklift queues limit) and the tasks' (declared in
-- code), by scope and name.
SELECT l.scope, l.name, l.concurrency, l.rate, l.per, l.keyed, l.key_arg, l.max_depth,
       l.rejected
FROM {schema}.limits AS l
ORDER BY l.scope, l.name;

-- name: queue_limit_lock
-- A queue's limits as they stand, its row locked until the change commits (no row: none).
SELECT l.id, l.concurrency, l.rate, l.per, l.max_depth
FROM {schema}.limits AS l
WHERE l.scope = 'queue' AND l.name = %(queue)s::text
FOR UPDATE;

-- name: queue_limit_set
-- Set a queue's limits: a `set_*` that is true takes its value (NULL removes that limit),
-- false keeps what the row has. Returns the row as it now is.
INSERT INTO {schema}.limits AS l (scope, name, concurrency, rate, per, max_depth)
VALUES ('queue', %(queue)s::text, %(concurrency)s::integer, %(rate)s::integer,
        %(per)s::float8, %(max_depth)s::integer)
ON CONFLICT (scope, name) DO UPDATE SET
    concurrency = CASE WHEN %(set_concurrency)s::boolean
                       THEN excluded.concurrency ELSE l.concurrency END,
    rate = CASE WHEN %(set_rate)s::boolean THEN excluded.rate ELSE l.rate END,
    per = CASE WHEN %(set_rate)s::boolean THEN excluded.per ELSE l.per END,
    max_depth = CASE WHEN %(set_max_depth)s::boolean
                     THEN excluded.max_depth ELSE l.max_depth END,
    updated_at = now()
RETURNING l.id, l.concurrency, l.rate, l.per, l.max_depth, l.rejected;

-- name: limit_window_reset
-- Forget a limit's rate windows: its `per` changed, and their buckets are hundredths of
-- the old one (counted on, they would hold the queue far too long, or not at all).
DELETE FROM {schema}.limit_windows WHERE limit_id = %(id)s::bigint;

-- name: queue_limit_clear
-- Remove a queue's limits (its rate windows go with them); returns what it had.
DELETE FROM {schema}.limits
WHERE scope = 'queue' AND name = %(queue)s::text
RETURNING scope, name, concurrency, rate, per, keyed, key_arg, max_depth, rejected;

-- name: ping
-- Is the database there, with forklift's tables in it? (NULL: not migrated)
SELECT to_regclass('{schema}.jobs');
