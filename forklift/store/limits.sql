-- Limits: the statements of a claim under concurrency and rate limits, their
-- registration, and queue backpressure. `{schema}` becomes the quoted schema name.

-- name: limits_apply
-- The limits a claim of these queues and tasks must hold (none: the plain claim), and
-- whether all of them may take the shared path (limit_lock, shared): concurrency only,
-- no key, and room for every lane's largest claim many times over.
SELECT count(*),
       coalesce(bool_and(l.rate IS NULL AND NOT l.keyed
                         AND l.concurrency >= 2 * %(lanes)s * %(lane_claim)s), false)
FROM {schema}.limits l
WHERE (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
  AND ((l.scope = 'task' AND l.name = ANY(%(tasks)s::text[]))
    OR (l.scope = 'queue' AND l.name = ANY(%(queues)s::text[])));

-- name: job_claim_shared
-- job_claim on the shared path, after limit_lock (shared): the plain claim of up to
-- `lane_claim` jobs (none under a limit it does not hold), taken only if a lane was free
-- and every limit it holds has room for what runs plus `lanes` such claims; otherwise
-- nothing, and `forklift.exact` says to claim on the exact path.
WITH held AS (
    SELECT l.id, l.scope, l.name, l.concurrency, l.rate, l.keyed
    FROM {schema}.limits l
    WHERE l.id = ANY(string_to_array(current_setting('forklift.limits'), ',')::bigint[])
), clock AS (
    SELECT clock_timestamp() AS at  -- after the locks: a start no claim before it counted
), unheld AS (
    SELECT l.scope, l.name FROM {schema}.limits l
    WHERE (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
      AND l.id NOT IN (SELECT id FROM held)
), room AS (
    SELECT current_setting('forklift.lane') <> '' AND NOT EXISTS (
        SELECT 1 FROM held h
        WHERE h.rate IS NOT NULL OR h.keyed OR h.concurrency IS NULL
           OR h.concurrency < %(lanes)s * %(lane_claim)s + (
               SELECT count(*) FROM {schema}.jobs j
               WHERE j.state = 'running'
                 AND ((h.scope = 'task' AND j.task = h.name)
                   OR (h.scope = 'queue' AND j.queue = h.name)))
    ) AS ok
), said AS (
    SELECT set_config('forklift.exact', (NOT ok)::text, true) AS exact FROM room
), ready AS (
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.queue = q.name AND j.available_at <= now()
          AND j.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT least(%(limit)s, %(lane_claim)s)
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE (SELECT exact FROM said) = 'false'
      AND q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND q.name NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'queue')
), expired AS (
    SELECT j.id, j.priority, j.available_at
    FROM {schema}.jobs j
    WHERE %(expired)s::boolean AND (SELECT exact FROM said) = 'false'
      AND j.state = 'running' AND j.lease_until < now()
      AND j.queue NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND j.queue NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'queue')
      AND j.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
      AND j.attempts < j.max_attempts AND j.queue = ANY(%(queues)s::text[])
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT least(%(limit)s, %(lane_claim)s)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (SELECT * FROM expired UNION ALL SELECT * FROM ready) AS p
    ORDER BY priority DESC, available_at, id
    LIMIT least(%(limit)s, %(lane_claim)s)
)
UPDATE {schema}.jobs AS j SET
    state = 'running',
    attempts = j.attempts + 1,
    lease_owner = %(owner)s::text,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    started_at = (SELECT at FROM clock),
    limited = j.task IN (SELECT h.name FROM held h WHERE h.scope = 'task')
           OR j.queue IN (SELECT h.name FROM held h WHERE h.scope = 'queue'),
    last_error = CASE WHEN j.state = 'running'
        THEN 'LeaseExpired: lease of ' || j.lease_owner || ' expired' ELSE j.last_error END,
    errors = CASE WHEN j.state = 'running'
        THEN j.errors || jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'worker', j.lease_owner,
            'error', 'LeaseExpired: lease of ' || j.lease_owner || ' expired')
        ELSE j.errors END
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING j.id, j.queue, j.task, j.args, j.idempotency_key, j.priority, j.attempts,
          j.max_attempts, j.timeout,
          greatest(0, extract(epoch FROM now() - j.available_at))::float8, j.batch_id;

-- name: limit_path
-- After job_claim_shared: whether it declined (claim on the exact path).
SELECT current_setting('forklift.exact', true) = 'true';

-- name: limit_lock
-- A limited claim's first statement: take a transaction lock per limit of these queues
-- and tasks (advisory, keyed by the limit's id: no row is written), in id order so
-- claimers never deadlock, and note their ids for the claim that follows, whose fresh
-- snapshot then sees every claim committed under them.
-- Exclusive (the exact path): that claim, job_claim_limited, keeps one plan (its custom
-- plans cost more to make than to run).
-- Shared (`shared`, for limits far from full): first one of `lanes` lane locks (tried,
-- never waited for; none free: the claim takes nothing and says so), so claims on
-- different lanes run side by side while an exact claim waits for them all. At most
-- `lanes` shared claims of `lane_claim` jobs each are in flight at once:
-- job_claim_shared claims only while what runs plus all of them fits.
SELECT set_config('forklift.limits', coalesce(string_agg(h.id::text, ','), ''), true),
       set_config('forklift.lane', CASE WHEN %(shared)s::boolean THEN coalesce((
           SELECT i::text FROM generate_series(0, %(lanes)s - 1) AS i
           WHERE pg_try_advisory_xact_lock(
               ('x' || left(md5('forklift:limit-lane:{schema}:' || i), 16))::bit(64)::bigint)
           LIMIT 1), '') ELSE '' END, true),
       set_config('plan_cache_mode', CASE WHEN %(shared)s::boolean
           THEN current_setting('plan_cache_mode') ELSE 'force_generic_plan' END, true)
FROM (
    SELECT s.id, CASE WHEN %(shared)s::boolean
        THEN pg_advisory_xact_lock_shared(s.key) ELSE pg_advisory_xact_lock(s.key) END
    FROM (
        SELECT l.id, ('x' || left(md5('forklift:limit:{schema}:' || l.id), 16))::bit(64)::bigint
               AS key
        FROM {schema}.limits l
        WHERE (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
          AND ((l.scope = 'task' AND l.name = ANY(%(tasks)s::text[]))
            OR (l.scope = 'queue' AND l.name = ANY(%(queues)s::text[])))
        ORDER BY l.id
    ) AS s
) AS h;

-- name: job_claim_limited
-- job_claim under limits, after limit_lock in the same transaction. Jobs of a full key
-- (running at its concurrency, or its rate window full) are passed over in the scan,
-- so a busy key never hides the others; among the rest, each key admits as many as it
-- has room for, in line order, then each queue limit among those. A job under a limit
-- this claim does not hold waits for a claim that does. Returns job_claim's columns,
-- then whether candidates were turned away (claim again: their keys are now full).
WITH held AS (
    SELECT l.id, l.scope, l.name, l.concurrency, l.rate, l.per, l.keyed, l.key_arg
    FROM {schema}.limits l
    WHERE l.id = ANY(string_to_array(current_setting('forklift.limits'), ',')::bigint[])
), clock AS (
    SELECT clock_timestamp() AS at
), unheld AS (
    SELECT l.scope, l.name FROM {schema}.limits l
    WHERE (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
      AND l.id NOT IN (SELECT id FROM held)
), running AS (
    SELECT h.id, CASE WHEN h.keyed THEN coalesce(j.limit_key, j.args ->> h.key_arg, '')
                      ELSE '' END AS key,
           count(*) AS n
    FROM {schema}.jobs j
    JOIN held h ON (h.scope = 'task' AND h.name = j.task) OR (h.scope = 'queue' AND h.name = j.queue)
    WHERE j.state = 'running' AND h.concurrency IS NOT NULL
    GROUP BY 1, 2
), windows AS (
    SELECT h.id, w.key, {schema}.limit_window_used(
        w.newest, w.counts, floor(extract(epoch FROM c.at) / (h.per / 100))::bigint) AS n
    FROM {schema}.limit_windows w JOIN held h ON h.id = w.limit_id, clock c
    WHERE h.rate IS NOT NULL
), used AS (
    SELECT id, key, sum(running)::bigint AS running, sum(started)::bigint AS started
    FROM (SELECT id, key, n AS running, 0 AS started FROM running
          UNION ALL SELECT id, key, 0, n FROM windows) AS u
    GROUP BY 1, 2
), full_keys AS (
    SELECT u.id, u.key FROM used u JOIN held h ON h.id = u.id
    WHERE u.running >= h.concurrency OR u.started >= h.rate
), full_tasks AS (
    -- (task, key) pairs with no room; an unkeyed limit's jobs all have key ''.
    SELECT h.name AS task, f.key, h.key_arg FROM full_keys f JOIN held h ON h.id = f.id
    WHERE h.scope = 'task'
), ready AS (
    SELECT c.* FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.available_at, j.queue, j.task, j.limit_key,
               CASE WHEN j.limit_key IS NULL THEN j.args END AS args, false AS expired
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.queue = q.name AND j.available_at <= now()
          AND j.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
          AND (j.task, coalesce(j.limit_key, '')) NOT IN (SELECT task, key FROM full_tasks)
          -- a job enqueued before its task's limit was known has no key stored yet
          AND (j.limit_key IS NOT NULL OR NOT EXISTS (
              SELECT 1 FROM full_tasks f
              WHERE f.task = j.task AND f.key = coalesce(j.args ->> f.key_arg, '')))
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s
    ) AS c
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND q.name NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'queue')
      AND q.name NOT IN (SELECT h.name FROM full_keys f JOIN held h ON h.id = f.id
                         WHERE h.scope = 'queue')
), expired AS (
    SELECT j.id, j.priority, j.available_at, j.queue, j.task, j.limit_key,
           CASE WHEN j.limit_key IS NULL THEN j.args END AS args, true AS expired
    FROM {schema}.jobs j
    WHERE %(expired)s::boolean AND j.state = 'running' AND j.lease_until < now()
      AND j.queue NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND j.attempts < j.max_attempts AND j.queue = ANY(%(queues)s::text[])
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT %(limit)s
), candidates AS (
    SELECT c.*, t.id AS task_limit, q.id AS queue_limit,
           t.keyed, CASE WHEN t.keyed THEN coalesce(c.limit_key, c.args ->> t.key_arg, '')
                         ELSE '' END AS key
    FROM (SELECT * FROM ready UNION ALL SELECT * FROM expired) AS c
    LEFT JOIN held t ON t.scope = 'task' AND t.name = c.task
    LEFT JOIN held q ON q.scope = 'queue' AND q.name = c.queue
    -- an expired job under a limit this claim does not hold waits, as a ready one does
    WHERE NOT EXISTS (SELECT 1 FROM unheld u WHERE (u.scope = 'task' AND u.name = c.task)
                                             OR (u.scope = 'queue' AND u.name = c.queue))
), by_task AS (
    -- Room per task key: its limit less what runs (an expired job re-run here keeps
    -- the slot it holds) and less what started in its window.
    SELECT c.*,
           row_number() OVER (PARTITION BY c.task_limit, c.key
                              ORDER BY c.priority DESC, c.available_at, c.id) AS place,
           least(
               coalesce(t.concurrency - coalesce(u.running, 0)
                        + count(*) FILTER (WHERE c.expired)
                              OVER (PARTITION BY c.task_limit, c.key), 2147483647),
               coalesce(t.rate - coalesce(u.started, 0), 2147483647)) AS room
    FROM candidates c
    LEFT JOIN held t ON t.id = c.task_limit
    LEFT JOIN used u ON u.id = c.task_limit AND u.key = c.key
), task_admitted AS (
    SELECT * FROM by_task WHERE task_limit IS NULL OR place <= room
), by_queue AS (
    SELECT a.id, a.priority, a.available_at, a.task_limit, a.queue_limit, a.key, a.keyed,
           row_number() OVER (PARTITION BY a.queue_limit
                              ORDER BY a.priority DESC, a.available_at, a.id) AS place,
           least(
               coalesce(q.concurrency - coalesce(u.running, 0)
                        + count(*) FILTER (WHERE a.expired) OVER (PARTITION BY a.queue_limit),
                        2147483647),
               coalesce(q.rate - coalesce(u.started, 0), 2147483647)) AS room
    FROM task_admitted a
    LEFT JOIN held q ON q.id = a.queue_limit
    LEFT JOIN used u ON u.id = a.queue_limit AND u.key = ''
), picked AS (
    SELECT * FROM by_queue WHERE queue_limit IS NULL OR place <= room
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
), taken AS (
    -- Only what it takes is locked (no candidate row is written): a job another claim
    -- took meanwhile, one that holds no limit this claim holds, is passed over.
    SELECT j.id FROM {schema}.jobs j
    WHERE j.id IN (SELECT id FROM picked)
      AND (j.state = 'ready' OR (j.state = 'running' AND j.lease_until < now()))
    FOR UPDATE SKIP LOCKED
), starts AS (
    -- What the jobs taken add to their rate windows.
    SELECT s.id, s.key, count(*)::integer AS n,
           floor(extract(epoch FROM c.at) / (h.per / 100))::bigint AS at
    FROM (SELECT task_limit AS id, key FROM picked WHERE task_limit IS NOT NULL
                                                     AND id IN (SELECT id FROM taken)
          UNION ALL SELECT queue_limit, '' FROM picked WHERE queue_limit IS NOT NULL
                                                     AND id IN (SELECT id FROM taken)) AS s
    JOIN held h ON h.id = s.id AND h.rate IS NOT NULL, clock c
    GROUP BY s.id, s.key, h.per, c.at
), counted AS (
    INSERT INTO {schema}.limit_windows AS w (limit_id, key, newest, counts)
    SELECT id, key, at, {schema}.limit_window_add(NULL, NULL, at, n) FROM starts
    ON CONFLICT (limit_id, key) DO UPDATE SET
        newest = greatest(w.newest, excluded.newest),
        counts = {schema}.limit_window_add(
            w.newest, w.counts, excluded.newest, excluded.counts[1])
    RETURNING 1  -- (a data-modifying CTE runs whether read or not)
), cut_short AS (
    -- Candidates were turned away while the scan stopped at its size: there may be jobs
    -- past it that are free to run (claim again, their keys are full now).
    SELECT (SELECT count(*) FROM ready) >= %(limit)s
       AND (SELECT count(*) FROM candidates) > (SELECT count(*) FROM by_queue
                                                WHERE queue_limit IS NULL OR place <= room)
           AS again
)
UPDATE {schema}.jobs AS j SET
    state = 'running',
    attempts = j.attempts + 1,
    lease_owner = %(owner)s::text,
    lease_until = now() + make_interval(secs => %(lease)s::float8),
    started_at = (SELECT at FROM clock),
    limited = p.task_limit IS NOT NULL OR p.queue_limit IS NOT NULL,
    limit_key = CASE WHEN p.keyed THEN p.key ELSE j.limit_key END,
    last_error = CASE WHEN j.state = 'running'
        THEN 'LeaseExpired: lease of ' || j.lease_owner || ' expired' ELSE j.last_error END,
    errors = CASE WHEN j.state = 'running'
        THEN j.errors || jsonb_build_object(
            'attempt', j.attempts, 'at', now(), 'worker', j.lease_owner,
            'error', 'LeaseExpired: lease of ' || j.lease_owner || ' expired')
        ELSE j.errors END
FROM picked AS p
WHERE j.id = p.id AND j.id IN (SELECT id FROM taken)
RETURNING j.id, j.queue, j.task, j.args, j.idempotency_key, j.priority, j.attempts,
          j.max_attempts, j.timeout,
          greatest(0, extract(epoch FROM now() - j.available_at))::float8, j.batch_id,
          (SELECT again FROM cut_short);

-- name: limit_wake
-- After a limited claim took less than it could: seconds until a rate window of these
-- queues' and tasks' limits frees, or the next delayed job is due (NULL: neither; a
-- freed concurrency slot notifies).
SELECT CASE WHEN w.at IS NOT NULL THEN greatest(0, w.at) END::float8
FROM (SELECT least(
    (SELECT min({schema}.limit_window_frees(w.newest, w.counts, l.per / 100))
            - extract(epoch FROM clock_timestamp())
     FROM {schema}.limit_windows w JOIN {schema}.limits l ON l.id = w.limit_id
     WHERE l.rate IS NOT NULL
       AND ((l.scope = 'task' AND l.name = ANY(%(tasks)s::text[]))
         OR (l.scope = 'queue' AND l.name = ANY(%(queues)s::text[])))
       AND {schema}.limit_window_used(w.newest, w.counts,
             floor(extract(epoch FROM clock_timestamp()) / (l.per / 100))::bigint) >= l.rate),
    (SELECT extract(epoch FROM min(available_at) - now()) FROM {schema}.jobs
     WHERE state = 'ready' AND queue = ANY(%(queues)s::text[]) AND available_at > now())
) AS at) AS w;

-- name: limit_windows_reset
-- A task limit's window changes length: its buckets (hundredths of the old length) mean
-- nothing under the new one, so they go.
DELETE FROM {schema}.limit_windows AS w
USING {schema}.limits AS l
WHERE l.id = w.limit_id AND l.scope = 'task' AND l.name = %(name)s::text
  AND l.per IS DISTINCT FROM %(per)s::float8;

-- name: limit_register
-- Write a task's limit as the code declares it (a worker at boot); unchanged: no write.
INSERT INTO {schema}.limits AS l (scope, name, concurrency, rate, per, keyed, key_arg)
VALUES ('task', %(name)s::text, %(concurrency)s::integer, %(rate)s::integer,
        %(per)s::float8, %(keyed)s::boolean, %(key_arg)s::text)
ON CONFLICT (scope, name) DO UPDATE SET
    concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
    keyed = excluded.keyed, key_arg = excluded.key_arg, updated_at = now()
WHERE (l.concurrency, l.rate, l.per, l.keyed, l.key_arg)
      IS DISTINCT FROM (excluded.concurrency, excluded.rate, excluded.per, excluded.keyed,
                        excluded.key_arg);

-- name: limit_unregister
-- Drop the limits of these tasks (their code declares none any more).
DELETE FROM {schema}.limits WHERE scope = 'task' AND name = ANY(%(names)s::text[]);

-- name: producer_limits
-- What an enqueue needs: every queue's max_depth, and the argument each keyed task
-- limit is keyed by.
SELECT scope, name, max_depth, key_arg FROM {schema}.limits
WHERE (scope = 'queue' AND max_depth IS NOT NULL) OR (scope = 'task' AND key_arg IS NOT NULL);

-- name: queue_depth
-- Ready and scheduled jobs of a queue, counted up to `upto` (an index-only scan).
SELECT count(*) FROM (
    SELECT 1 FROM {schema}.jobs WHERE state = 'ready' AND queue = %(queue)s::text
    LIMIT %(upto)s::integer
) AS d;

-- name: queue_rejected
-- Count enqueues refused by a queue's max_depth.
UPDATE {schema}.limits SET rejected = rejected + %(n)s::bigint
WHERE scope = 'queue' AND name = %(queue)s::text;
