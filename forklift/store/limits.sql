-- Limits: the statements of a claim under concurrency and rate limits, their
-- registration, and queue backpressure. `{schema}` becomes the quoted schema name.

-- name: limits_apply
-- The limits a claim of these queues and tasks must hold (none: the plain claim), and
-- whether all of them may take the shared path (limit_lock, shared): concurrency only,
-- no key, and room for every lane's largest claim many times over. Also whether jobs of
-- these tasks wait with a limit's key stored that no limit has any more (the limit was
-- dropped, or only their producer declares it): only a claim under limits takes those.
-- The tasks with keyed jobs in each queue are found by a loose index scan.
WITH RECURSIVE keyed(queue, task) AS (
    SELECT f.* FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.queue, j.task FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.name
        ORDER BY j.queue, j.task LIMIT 1
    ) AS f
    UNION ALL
    SELECT n.* FROM keyed k,
    LATERAL (
        SELECT j.queue, j.task FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = k.queue
          AND j.task > k.task
        ORDER BY j.queue, j.task LIMIT 1
    ) AS n
)
SELECT count(*) AS limits,
       coalesce(bool_and(l.rate IS NULL AND NOT l.keyed
                         AND l.concurrency >= 2 * %(lanes)s * %(lane_claim)s), false) AS shared,
       EXISTS (SELECT 1 FROM keyed k
               WHERE k.task = ANY(%(tasks)s::text[])
                 AND k.task NOT IN (SELECT t.name FROM {schema}.limits t
                                    WHERE t.scope = 'task'
                                      AND (t.concurrency IS NOT NULL OR t.rate IS NOT NULL)))
           AS keyed_unlimited,
       -- fair jobs wait in these queues: with no limit to hold, claim in turns
       -- (store/fair.sql); asked here, not in a round trip of its own
       EXISTS (SELECT 1 FROM unnest(%(queues)s::text[]) AS q(name) WHERE {_fair_waiting})
           AS fair
FROM {schema}.limits l
WHERE (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
  AND ((l.scope = 'task' AND l.name = ANY(%(tasks)s::text[]))
    OR (l.scope = 'queue' AND l.name = ANY(%(queues)s::text[])));

-- name: _limits_held
-- The first part of a claim under limits (job_claim_shared, job_claim_limited), after
-- limit_lock in its transaction: `held`, the limits whose locks it holds (their ids in
-- `forklift.limits`); `clock`, the time its jobs start at, read after the locks (a start
-- no claim before it counted); `unheld`, every other limit in force, whose jobs wait for
-- a claim that holds it.
held AS (
    SELECT l.id, l.scope, l.name, l.concurrency, l.rate, l.per, l.keyed, l.key_arg
    FROM {schema}.limits l
    WHERE l.id = ANY(string_to_array(current_setting('forklift.limits'), ',')::bigint[])
), clock AS (
    SELECT clock_timestamp() AS at
), unheld AS (
    SELECT l.scope, l.name FROM {schema}.limits l
    WHERE (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
      AND l.id NOT IN (SELECT id FROM held)
)

-- name: _lane_room
-- Whether a claim on the shared path may claim (after _limits_held): `room`, whether it
-- holds a lane and every limit it holds (none keyed, none with a rate) has room for what
-- runs plus `lanes` claims of `lane_claim` jobs; `said`, the answer noted in
-- `forklift.exact` (limit_path reads it), and the queues woken (`woke`) when it declines
-- after completing jobs in its transaction, whose freed slots woke no worker.
room AS (
    SELECT current_setting('forklift.lane') <> '' AND NOT EXISTS (
        SELECT 1 FROM held h
        WHERE h.rate IS NOT NULL OR h.keyed OR h.concurrency IS NULL
           OR h.concurrency < %(lanes)s * %(lane_claim)s + (
               SELECT count(*) FROM (
                   SELECT j.task, j.queue FROM {schema}.jobs j WHERE j.state = 'running'
                   UNION ALL  -- cancelled, their handlers still stopping (migration 0013)
                   SELECT j.task, j.queue FROM {schema}.jobs j
                   WHERE j.stopping_owner IS NOT NULL AND j.stopping_until > now()
               ) AS j
               WHERE (h.scope = 'task' AND j.task = h.name)
                  OR (h.scope = 'queue' AND j.queue = h.name))
    ) AS ok
), said AS (
    SELECT set_config('forklift.exact', (NOT ok)::text, true) AS exact,
           CASE WHEN NOT ok AND current_setting('forklift.claiming', true) = 'on'
                THEN (SELECT count(pg_notify('{channel}', q)) FROM unnest(%(queues)s::text[]) AS q)
           END AS woke
    FROM room
)

-- name: job_claim_shared
-- job_claim on the shared path, after limit_lock (shared): the plain claim of up to
-- `lane_claim` jobs (none under a limit it does not hold), taken only if a lane was free
-- and every limit it holds has room for what runs plus `lanes` such claims; otherwise
-- nothing, and `forklift.exact` says to claim on the exact path.
WITH {_limits_held}, {_lane_room}, ready AS (
    -- The first jobs of each queue's two claim indexes (no limit's key stored, and one
    -- stored: migration 0007); on this path no limit held is keyed.
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.requires IS NULL
          AND j.queue = q.name AND j.available_at <= now()
          AND j.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT least(%(limit)s, %(lane_claim)s)
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE (SELECT exact FROM said) = 'false'
      AND q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND q.name NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'queue')
), ready_limited AS (
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.name
          AND j.available_at <= now()
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
      AND j.queue NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'queue')
      AND j.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
      AND {_lease_expired}
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT least(%(limit)s, %(lane_claim)s)
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (SELECT * FROM expired UNION ALL SELECT * FROM ready
                    UNION ALL SELECT * FROM ready_limited) AS p
    ORDER BY priority DESC, available_at, id
    LIMIT least(%(limit)s, %(lane_claim)s)
)
UPDATE {schema}.jobs AS j SET
    {_lease_taken},
    started_at = (SELECT at FROM clock),
    limited = j.task IN (SELECT h.name FROM held h WHERE h.scope = 'task')
           OR j.queue IN (SELECT h.name FROM held h WHERE h.scope = 'queue'),
    {_lease_lost}
WHERE j.id = ANY(ARRAY(SELECT id FROM picked))
RETURNING {_claimed};

-- name: claim_completing
-- First in a claim's transaction that completes jobs too: their freed slots wake no
-- worker (jobs_notify_freed); the claim takes them, and wakes the queue if it leaves any.
SELECT set_config('forklift.claiming', 'on', true);

-- name: limit_path
-- After job_claim_shared: whether it declined (claim on the exact path).
SELECT current_setting('forklift.exact', true) = 'true' AS exact;

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

-- name: _limits_used
-- The held limits' use (after _limits_held): `task_limits`, every task limit, held or
-- not, and how a job of its task is keyed; `used`, per held limit and key, the jobs
-- running under it and the starts in its rate window; `full_keys` (limit, key) and
-- `full_tasks` (task, key), those with no room.
task_limits AS (
    -- Every task limit, held or not: how a job of its task is keyed.
    SELECT l.name, l.keyed, l.key_arg FROM {schema}.limits l
    WHERE l.scope = 'task' AND (l.concurrency IS NOT NULL OR l.rate IS NOT NULL)
), running AS (
    SELECT h.id, CASE WHEN h.keyed THEN coalesce(j.limit_key, j.args ->> h.key_arg, '')
                      ELSE '' END AS key,
           count(*) AS n
    FROM (
        SELECT j.task, j.queue, j.limit_key, j.args FROM {schema}.jobs j
        WHERE j.state = 'running'
        UNION ALL
        -- Cancelled jobs whose handlers may still run (their worker holds them until
        -- they stop: migration 0013) keep their slots; each index bounds its part.
        SELECT j.task, j.queue, j.limit_key, j.args FROM {schema}.jobs j
        WHERE j.stopping_owner IS NOT NULL AND j.stopping_until > now()
    ) AS j
    JOIN held h ON (h.scope = 'task' AND h.name = j.task) OR (h.scope = 'queue' AND h.name = j.queue)
    WHERE h.concurrency IS NOT NULL
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
    SELECT h.name AS task, f.key FROM full_keys f JOIN held h ON h.id = f.id
    WHERE h.scope = 'task'
)

-- name: _limited_walks
-- Where a claim under limits looks first, per queue neither paused, nor under a limit it
-- does not hold, nor full (`open_queues`), in line order (migration 0007):
-- - `plain`: the first `limit` jobs with no key stored (jobs_ready_unlabelled_idx), each
--   with the key a limit of its task gives it (NULL: no limit). A job of a limited task
--   among them (its producer did not know the limit) is keyed by its arguments; if there
--   are any, the first `limit` + `rekey` of the queue's jobs are stored with their keys
--   (_limited_taken's `rekeyed`, all but those taken): they move to the limited indexes,
--   and a later claim does not walk past them again.
-- - `walked`: the jobs with a key stored (jobs_ready_limited_idx), at most `limit` +
--   `visit` of them; `open_walked`, those whose task is held and key not full.
open_queues AS (
    SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
      AND q.name NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'queue')
      AND q.name NOT IN (SELECT h.name FROM full_keys f JOIN held h ON h.id = f.id
                         WHERE h.scope = 'queue')
), plain_walk AS (
    SELECT c.* FROM open_queues q,
    LATERAL (
        SELECT j.id, j.priority, j.available_at, j.queue, j.task, j.args
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.requires IS NULL
          AND j.queue = q.name AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s
    ) AS c
), plain AS (
    -- keyed: its task has a limit (the key as the claim stores it); else NULL
    SELECT w.id, w.priority, w.available_at, w.queue, w.task,
           CASE WHEN t.name IS NULL THEN NULL
                WHEN t.keyed THEN coalesce(w.args ->> t.key_arg, '') ELSE '' END AS key
    FROM plain_walk w LEFT JOIN task_limits t ON t.name = w.task
), walked AS (
    SELECT c.* FROM open_queues q,
    LATERAL (
        SELECT j.id, j.priority, j.available_at, j.queue, j.task, j.limit_key AS key
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.name
          AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s + %(visit)s
    ) AS c
), open_walked AS (
    SELECT w.* FROM walked w
    WHERE w.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
      AND (w.task, w.key) NOT IN (SELECT f.task, f.key FROM full_tasks f)
)

-- name: _limited_heads
-- Where a claim under limits looks next (after _limited_walks): only in the queues whose
-- walk stopped at its length short of `limit` candidates (`cut`: the keys in front are
-- full), the first jobs of every other key with room (`heads`), found one probe per key
-- (jobs_ready_key_idx), at most `keys` keys (`looked`) from where the last claim's look
-- ended (`after_*`). So a key with 10,000 held-back jobs costs a claim what one with 10
-- does, and the first of another key still runs before them.
cut AS (
    -- Queues whose walk stopped at its length with fewer than `limit` jobs to offer.
    SELECT w.queue FROM walked w GROUP BY w.queue
    HAVING count(*) >= %(limit)s + %(visit)s
       AND (SELECT count(*) FROM open_walked o WHERE o.queue = w.queue) < %(limit)s
), resume AS (
    -- Where each of those queues' look at its keys starts: after the key the last look
    -- ended at (`after_*`, per queue, from the claimer), or from its first key.
    SELECT cut.queue, coalesce(a.task, '') AS task, coalesce(a.key, '') AS key FROM cut
    LEFT JOIN unnest(%(after_queues)s::text[], %(after_tasks)s::text[],
                     %(after_keys)s::text[]) AS a(queue, task, key) ON a.queue = cut.queue
), keys AS (
    -- The keys with ready jobs in those queues, in key order from there (a loose index
    -- scan of jobs_ready_key_idx, one probe a key), at most `keys` of them a claim: a
    -- claim's cost stays bounded however many keys wait, and the next claim looks on
    -- from where this one ended (round the queue's keys and back to its first).
    SELECT f.* FROM resume r,
    LATERAL (
        SELECT s.queue, s.task, s.key FROM (
            (SELECT j.queue, j.task, j.limit_key AS key, 0 AS turn FROM {schema}.jobs j
             WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = r.queue
               AND (j.task, j.limit_key) > (r.task, r.key)
             ORDER BY j.queue, j.task, j.limit_key
             LIMIT 1)
            UNION ALL
            (SELECT j.queue, j.task, j.limit_key, 1 FROM {schema}.jobs j
             WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = r.queue
             ORDER BY j.queue, j.task, j.limit_key
             LIMIT 1)
        ) AS s
        ORDER BY s.turn
        LIMIT 1
    ) AS f
    UNION ALL
    SELECT n.* FROM keys k,
    LATERAL (
        SELECT j.queue, j.task, j.limit_key AS key FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = k.queue
          AND (j.task, j.limit_key) > (k.task, k.key)
        ORDER BY j.queue, j.task, j.limit_key
        LIMIT 1
    ) AS n
), looked AS (
    SELECT * FROM keys LIMIT %(keys)s
), heads AS (
    SELECT c.* FROM looked AS k
    LEFT JOIN held t ON t.scope = 'task' AND t.name = k.task
    LEFT JOIN used u ON u.id = t.id AND u.key = k.key
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.available_at, j.queue, j.task, j.limit_key AS key
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = k.queue
          AND j.task = k.task AND j.limit_key = k.key AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT greatest(0, least(%(limit)s::bigint, t.concurrency - coalesce(u.running, 0),
                                t.rate - coalesce(u.started, 0)))
    ) AS c
    WHERE k.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
      AND (k.task, k.key) NOT IN (SELECT f.task, f.key FROM full_tasks f)
      AND c.id NOT IN (SELECT id FROM walked)
)

-- name: _limited_candidates
-- What a claim under limits may take (after _limited_heads): the jobs it found ready and
-- open, and (with `expired`) lost ones (`expired`), each with its key and the held
-- limits it counts against (`task_limit`, `queue_limit`; NULL: none).
expired AS (
    SELECT j.id, j.priority, j.available_at, j.queue, j.task,
           CASE WHEN t.name IS NULL THEN j.limit_key
                WHEN t.keyed THEN coalesce(j.limit_key, j.args ->> t.key_arg, '')
                ELSE coalesce(j.limit_key, '') END AS key
    FROM {schema}.jobs j LEFT JOIN task_limits t ON t.name = j.task
    WHERE %(expired)s::boolean AND {_lease_expired}
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT %(limit)s
), candidates AS (
    SELECT c.*, t.id AS task_limit, q.id AS queue_limit
    FROM (SELECT p.*, false AS expired FROM plain p
          WHERE p.task NOT IN (SELECT u.name FROM unheld u WHERE u.scope = 'task')
            AND (p.key IS NULL
                 OR (p.task, p.key) NOT IN (SELECT f.task, f.key FROM full_tasks f))
          UNION ALL SELECT o.*, false FROM open_walked o
          UNION ALL SELECT h.*, false FROM heads h
          UNION ALL SELECT e.*, true FROM expired e) AS c
    LEFT JOIN held t ON t.scope = 'task' AND t.name = c.task
    LEFT JOIN held q ON q.scope = 'queue' AND q.name = c.queue
    -- an expired job under a limit this claim does not hold waits, as a ready one does
    WHERE NOT EXISTS (SELECT 1 FROM unheld u WHERE (u.scope = 'task' AND u.name = c.task)
                                             OR (u.scope = 'queue' AND u.name = c.queue))
)

-- name: _limited_admitted
-- What a claim under limits would take (after _limited_candidates): among the
-- candidates, in line order, each task key admits as many as it has room for
-- (`task_admitted`), then each queue limit among those (`admitted`); of those under a
-- limit, at most its worker's `share`; at most `limit` in all (`picked`).
by_task AS (
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
    SELECT a.id, a.priority, a.available_at, a.task_limit, a.queue_limit, a.key,
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
), admitted AS (
    -- `limited`: under a limit this claim holds; `nth_limited`: its place among those
    SELECT a.*, count(*) FILTER (WHERE a.limited)
                OVER (ORDER BY a.priority DESC, a.available_at, a.id) AS nth_limited
    FROM (SELECT b.*, b.task_limit IS NOT NULL OR b.queue_limit IS NOT NULL AS limited
          FROM by_queue b WHERE b.queue_limit IS NULL OR b.place <= b.room) AS a
), share AS (
    -- A claim takes at most its worker's share of the slots its limits have: what they
    -- admit now plus what runs under them, over the live workers of these queues (the
    -- process registry; none registered: this one). Else one worker claiming ahead takes
    -- every key's slot at once while the others, finding every key full, sleep: with
    -- tiny jobs the whole limit would run on one worker. What it leaves, `told` wakes
    -- the others for.
    SELECT greatest(1, ceil(
        ((SELECT count(*) FROM admitted WHERE limited)
         + (SELECT coalesce(sum(running), 0) FROM used))::numeric
        / greatest(1, (SELECT count(*) FROM {schema}.processes p
                       WHERE p.kind = 'worker' AND p.queues && %(queues)s::text[]
                         AND p.heartbeat_at > now() - interval '20 seconds'))))::bigint AS n
), picked AS (
    SELECT * FROM admitted
    WHERE NOT limited OR nth_limited <= (SELECT n FROM share)
    ORDER BY priority DESC, available_at, id
    LIMIT %(limit)s
)

-- name: _limited_taken
-- What a claim under limits takes and writes besides its jobs (after _limited_admitted):
-- `taken`, the picked jobs still free, locked; `rekeyed`, the unkeyed jobs of limited
-- tasks its walk met, stored with their keys; `counted`, what those taken add to their
-- rate windows; `told`, the queues woken for what it left free to run.
taken AS (
    -- Only what it takes is locked (no candidate row is written): a job another claim
    -- took meanwhile, one that holds no limit this claim holds, is passed over.
    SELECT j.id FROM {schema}.jobs j
    WHERE j.id IN (SELECT id FROM picked)
      AND (j.state = 'ready' OR (j.state = 'running' AND j.lease_until < now()))
    FOR UPDATE SKIP LOCKED
), unkeyed AS (
    -- The walk met jobs of a limited task waiting with no key (their producer did not
    -- know the limit): the first `limit` + `rekey` of the queue's jobs of limited tasks,
    -- but those taken now (the claim keys them).
    SELECT v.id FROM open_queues q,
    LATERAL (
        SELECT w.id, w.task FROM {schema}.jobs w
        WHERE w.state = 'ready' AND w.limit_key IS NULL AND w.requires IS NULL
          AND w.queue = q.name AND w.available_at <= now()
        ORDER BY w.priority DESC, w.available_at, w.id
        LIMIT %(limit)s + %(rekey)s
    ) AS v
    WHERE EXISTS (SELECT 1 FROM plain p WHERE p.queue = q.name AND p.key IS NOT NULL)
      AND v.task IN (SELECT name FROM task_limits)
      AND v.id NOT IN (SELECT id FROM picked)
), rekeyed AS (
    -- ... are stored with their keys: they leave the plain index, and no later claim
    -- walks past them there.
    -- (Locked and found by id alone, the state checked in SET: a condition on the state
    -- would let the planner scan a ready index for the ids, which costs a table's worth
    -- where it has no statistics.)
    UPDATE {schema}.jobs AS j
    SET limit_key = CASE WHEN j.state <> 'ready' OR j.limit_key IS NOT NULL THEN j.limit_key
                         WHEN t.keyed THEN coalesce(j.args ->> t.key_arg, '') ELSE '' END
    FROM task_limits t
    WHERE t.name = j.task AND j.id = ANY(ARRAY(
        SELECT r.id FROM {schema}.jobs r
        WHERE r.id = ANY(ARRAY(SELECT id FROM unkeyed))
        FOR UPDATE SKIP LOCKED))
    RETURNING 1
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
    RETURNING 1
), told AS (
    -- A claim that completed jobs in its transaction (`forklift.claiming`) and left jobs
    -- free to run (more than it could take): wake their queues' workers.
    SELECT pg_notify('{channel}', b.queue) FROM (
        SELECT DISTINCT c.queue FROM admitted a JOIN candidates c ON c.id = a.id
        WHERE a.id NOT IN (SELECT id FROM picked)
    ) AS b
    WHERE current_setting('forklift.claiming', true) = 'on'
)

-- name: _limited_again
-- Whether a claim under limits should claim again at once, and what the claimer keeps
-- (after _limited_taken): `cut_short`, its one row (`again`, `after_*`, `woke`,
-- `shared`).
took_share AS (
    SELECT count(*) >= (SELECT n FROM share) AS took FROM picked WHERE limited
), cut_short AS (
    -- Fewer taken than asked while a walk stopped at its length, past which there may be
    -- jobs free to run (their keys' slots are filled now, or they were keyed just now):
    -- claim again. Not when every key was looked at (`heads`), unless the keys ran past
    -- `keys` and some were taken: that would find the same keys again, full. Not when
    -- it took its share (`share`): the rest is for other workers.
    SELECT (SELECT count(*) FROM admitted) < %(limit)s AND NOT (SELECT took FROM took_share)
       AND (EXISTS (SELECT 1 FROM plain_walk GROUP BY queue HAVING count(*) >= %(limit)s)
            OR EXISTS (SELECT 1 FROM rekeyed)
            OR EXISTS (SELECT 1 FROM walked GROUP BY queue
                       HAVING count(*) >= %(limit)s + %(visit)s
                          AND queue NOT IN (SELECT queue FROM cut))
            OR ((SELECT count(*) FROM looked) >= %(keys)s AND EXISTS (SELECT 1 FROM taken)))
           AS again,
           (SELECT count(*) FROM told) AS woke,  -- (read, so that told runs)
           (SELECT took FROM took_share) AS shared,
           -- where each queue's look at its keys ended (NULL: none looked)
           (SELECT array_agg(l.queue ORDER BY l.queue) FROM (
                SELECT DISTINCT ON (queue) queue, task, key FROM looked
                ORDER BY queue, task DESC, key DESC) AS l) AS after_queues,
           (SELECT array_agg(l.task ORDER BY l.queue) FROM (
                SELECT DISTINCT ON (queue) queue, task, key FROM looked
                ORDER BY queue, task DESC, key DESC) AS l) AS after_tasks,
           (SELECT array_agg(l.key ORDER BY l.queue) FROM (
                SELECT DISTINCT ON (queue) queue, task, key FROM looked
                ORDER BY queue, task DESC, key DESC) AS l) AS after_keys
)

-- name: job_claim_limited
-- job_claim under limits, after limit_lock in the same transaction. Jobs of a full key
-- (running at its concurrency, or its rate window full) are passed over, so a busy key
-- never hides the others; among the rest, each key admits as many as it has room for,
-- in line order, then each queue limit among those. A job under a limit this claim does
-- not hold waits for a claim that does. Returns the claimed columns (`_claimed`), then
-- whether candidates were turned away (`again`: their keys are now full), where its look
-- at the keys ended (`after_*`), and whether it took its share (`shared`).
--
-- Built of the fragments above, in order, each naming the CTEs it adds from those of
-- the ones before it (each is run alone in tests/integration/test_claim_parts.py).
WITH RECURSIVE {_limits_held},
{_limits_used},
{_limited_walks},
{_limited_heads},
{_limited_candidates},
{_limited_admitted},
{_limited_taken},
{_limited_again}, claimed AS (
    UPDATE {schema}.jobs AS j SET
        {_lease_taken},
        started_at = (SELECT at FROM clock),
        limited = p.limited,
        limit_key = coalesce(j.limit_key, p.key),
        {_lease_lost}
    FROM picked AS p
    WHERE j.id = p.id AND j.id IN (SELECT id FROM taken)
    RETURNING {_claimed}
)
-- At least one row, so that `again` is told when nothing was taken (a row of NULLs then).
SELECT c.*, s.again, s.after_queues, s.after_tasks, s.after_keys, s.woke, s.shared
FROM cut_short AS s LEFT JOIN claimed AS c ON true;

-- name: limit_wake
-- After a limited claim took less than it could: seconds until a rate window of these
-- queues' and tasks' limits frees, or the next delayed job is due (NULL: neither; a
-- freed concurrency slot notifies). A window counts if it was full when the claim ran,
-- `since` seconds ago (the worker's own clock; no skew): one that has freed since then
-- gives 0, claim again now, rather than nothing, which would sleep a whole poll
-- interval while the window stands open. A delayed job counts if it fell due after the
-- claim: one due before, it passed over (held back by a full key), and one due since
-- gives 0. Each queue's next is one probe of each due-time index (migration 0011).
SELECT CASE WHEN w.at IS NOT NULL THEN greatest(0, w.at) END::float8 AS wake_in
FROM (SELECT least(
    (SELECT min({schema}.limit_window_frees(w.newest, w.counts, l.per / 100))
            - extract(epoch FROM clock_timestamp())
     FROM {schema}.limit_windows w JOIN {schema}.limits l ON l.id = w.limit_id
     WHERE l.rate IS NOT NULL
       AND ((l.scope = 'task' AND l.name = ANY(%(tasks)s::text[]))
         OR (l.scope = 'queue' AND l.name = ANY(%(queues)s::text[])))
       AND {schema}.limit_window_used(w.newest, w.counts,
             floor((extract(epoch FROM clock_timestamp()) - %(since)s::float8)
                   / (l.per / 100))::bigint) >= l.rate),
    (SELECT extract(epoch FROM min(f.available_at) - now())
     FROM unnest(%(queues)s::text[]) AS q(name),
     LATERAL (
        (SELECT j.available_at FROM {schema}.jobs j
         WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.queue = q.name
           AND j.available_at > now() - make_interval(secs => %(since)s::float8)
         ORDER BY j.available_at LIMIT 1)
        UNION ALL
        (SELECT j.available_at FROM {schema}.jobs j
         WHERE j.state = 'ready' AND j.limit_key IS NOT NULL AND j.queue = q.name
           AND j.available_at > now() - make_interval(secs => %(since)s::float8)
         ORDER BY j.available_at LIMIT 1)
     ) AS f)
) AS at) AS w;

-- name: limit_declare_lock
-- Before limit_register, in its transaction: the limit's lock (limit_lock's, exclusive),
-- so no claim counts or adds starts under it while its window changes length.
SELECT pg_advisory_xact_lock(('x' || left(md5('forklift:limit:{schema}:' || l.id), 16))::bit(64)::bigint)
FROM {schema}.limits l WHERE l.scope = 'task' AND l.name = %(name)s::text;

-- name: limit_register
-- A worker declares a task's limit (at boot, `boot`; then every DECLARE_EVERY while it
-- claims). `updated_at` is when a worker last declared it as it stands. Written:
-- - missing: always (a limit is never out of force while a worker declares it);
-- - the same: only its `updated_at`, at most every `fresh` seconds (one write however
--   many workers declare it);
-- - different (another version's): at boot (the last worker to start wins), else only
--   once no worker has declared the stored one for `stale` seconds.
-- A change of a rate's window length keeps the starts its window holds, counted as made
-- now in the new one's newest bucket (never fewer starts than ran in either window).
WITH old AS (
    SELECT l.id, l.per FROM {schema}.limits l
    WHERE l.scope = 'task' AND l.name = %(name)s::text
), written AS (
    INSERT INTO {schema}.limits AS l (scope, name, concurrency, rate, per, keyed, key_arg)
    VALUES ('task', %(name)s::text, %(concurrency)s::integer, %(rate)s::integer,
            %(per)s::float8, %(keyed)s::boolean, %(key_arg)s::text)
    ON CONFLICT (scope, name) DO UPDATE SET
        concurrency = excluded.concurrency, rate = excluded.rate, per = excluded.per,
        keyed = excluded.keyed, key_arg = excluded.key_arg, updated_at = now()
    WHERE CASE WHEN (l.concurrency, l.rate, l.per, l.keyed, l.key_arg)
                    IS NOT DISTINCT FROM (excluded.concurrency, excluded.rate, excluded.per,
                                          excluded.keyed, excluded.key_arg)
               THEN l.updated_at < now() - make_interval(secs => %(fresh)s::float8)
               ELSE %(boot)s::boolean
                    OR l.updated_at < now() - make_interval(secs => %(stale)s::float8) END
    RETURNING l.id, l.per
), clock AS (
    SELECT extract(epoch FROM clock_timestamp()) AS at
)
UPDATE {schema}.limit_windows AS w SET
    newest = floor(c.at / (n.per / 100))::bigint,
    counts = {schema}.limit_window_add(NULL, NULL, floor(c.at / (n.per / 100))::bigint,
        {schema}.limit_window_used(w.newest, w.counts, floor(c.at / (o.per / 100))::bigint))
FROM old o JOIN written n ON n.id = o.id, clock c
WHERE w.limit_id = o.id AND o.per IS DISTINCT FROM n.per AND n.per IS NOT NULL
  AND o.per IS NOT NULL;

-- name: limit_unregister
-- Drop the limits of these tasks (the caller's code declares none), each only once no
-- worker has declared it for `stale` seconds and no job claimed under it still runs:
-- during a rolling deploy, the version that declares a limit keeps it in force.
DELETE FROM {schema}.limits AS l
WHERE l.scope = 'task' AND l.name = ANY(%(names)s::text[])
  AND l.updated_at < now() - make_interval(secs => %(stale)s::float8)
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j
                  WHERE j.state = 'running' AND j.task = l.name AND j.limited)
  AND NOT EXISTS (SELECT 1 FROM {schema}.jobs j
                  WHERE j.stopping_owner IS NOT NULL AND j.task = l.name AND j.limited);

-- name: job_stopping_renew
-- Extend the holds of cancelled jobs whose handlers still run here (`owner`'s, at these
-- attempts): their limits' slots stay taken while they run. Returns the ids renewed.
UPDATE {schema}.jobs AS j SET
    stopping_until = now() + make_interval(secs => %(lease)s::float8)
FROM unnest(%(ids)s::bigint[], %(attempts)s::integer[]) AS h(id, attempt)
WHERE j.id = h.id AND j.attempts = h.attempt AND j.stopping_owner = %(owner)s::text
RETURNING j.id;

-- name: job_stopping_let_go
-- A cancelled job's handler stopped here (`owner`'s, at this attempt): its hold ends and
-- its limits' slots free; its queue's workers are woken, as when a running job ends.
WITH gone AS (
    UPDATE {schema}.jobs AS j SET stopping_owner = NULL, stopping_until = NULL
    WHERE j.id = %(id)s::bigint AND j.attempts = %(attempt)s::integer
      AND j.stopping_owner = %(owner)s::text
    RETURNING j.queue, j.limited
)
SELECT count(pg_notify('{channel}', g.queue)) FROM gone AS g WHERE g.limited;

-- name: producer_limits
-- What an enqueue needs: every queue's max_depth, and each limited task with the
-- argument its limit is keyed by (NULL: none, or a callable's).
SELECT scope, name, max_depth, key_arg FROM {schema}.limits
WHERE (scope = 'queue' AND max_depth IS NOT NULL)
   OR (scope = 'task' AND (concurrency IS NOT NULL OR rate IS NOT NULL));

-- name: queue_depth
-- Ready and scheduled jobs of a queue, counted up to `upto` (index-only scans of its two
-- claim indexes).
SELECT count(*) FROM (
    (SELECT 1 FROM {schema}.jobs
     WHERE state = 'ready' AND limit_key IS NULL AND queue = %(queue)s::text
     LIMIT %(upto)s::integer)
    UNION ALL
    (SELECT 1 FROM {schema}.jobs
     WHERE state = 'ready' AND limit_key IS NOT NULL AND queue = %(queue)s::text
     LIMIT %(upto)s::integer)
    LIMIT %(upto)s::integer
) AS d;

-- name: queue_rejected
-- Count enqueues refused by a queue's max_depth.
UPDATE {schema}.limits SET rejected = rejected + %(n)s::bigint
WHERE scope = 'queue' AND name = %(queue)s::text;
