-- Fair shares: the claim of queues that hold jobs of fair tasks (migration 0023); which
-- queues do, limits_apply says (store/limits.sql). `{schema}` becomes the quoted schema
-- name.

-- name: _plain_ready
-- A fragment: whether job `j` is a plain one (no limit's key, no fair key, no labels
-- required) ready and due in queue `q`.
j.state = 'ready' AND j.limit_key IS NULL AND j.fair_key IS NULL AND j.requires IS NULL
           AND j.queue = q.name AND j.available_at <= now()

-- name: job_claim_fair
-- job_claim for queues that hold fair jobs: up to `limit` jobs in turn order. A fair
-- job's turn was dealt at its insert (migration 0023: its key's last turn plus
-- 1/weight, or the head's), so the line of fair jobs (`fair`), read in turn order
-- through one index, already interleaves their keys. Beside it, two lines take turns
-- as one key each, in due order: the queues' jobs of no key (`plain`), and the fair
-- jobs that hold no turn, due later when they were enqueued or given back (`late`:
-- they arrive as they fall due). The n-th of each stands at the head's turn plus
-- n - 1. Lost jobs (`expired`, when asked) come first, as in job_claim. Each line locks
-- what it reads past other claims' locks; what the merge leaves is unlocked at the
-- commit.
WITH fair AS (
    SELECT c.id, c.priority, c.fair_turn AS turn
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.fair_turn
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.fair_key IS NOT NULL
          AND j.fair_turn IS NOT NULL AND j.queue = q.name AND j.available_at <= now()
        ORDER BY j.priority DESC, j.fair_turn, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
), late AS (
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT j.id, j.priority, j.available_at
        FROM {schema}.jobs j
        WHERE j.state = 'ready' AND j.limit_key IS NULL AND j.fair_key IS NOT NULL
          AND j.fair_turn IS NULL AND j.queue = q.name AND j.available_at <= now()
        ORDER BY j.priority DESC, j.available_at, j.id
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
), plain AS (
    -- The plain claim's two indexes (jobs_ready_open_idx, jobs_ready_open_ranked_idx,
    -- migration 0026), read as job_claim_one reads them: higher priorities, the
    -- default, lower, each as far as the limit.
    SELECT c.id, c.priority, c.available_at
    FROM unnest(%(queues)s::text[]) AS q(name),
    LATERAL (
        SELECT * FROM (SELECT j.id, j.priority, j.available_at FROM {schema}.jobs j
         WHERE {_plain_ready} AND j.priority > 0
         ORDER BY j.priority DESC, j.available_at, j.id
         LIMIT %(limit)s
         FOR UPDATE SKIP LOCKED) AS higher
        UNION ALL
        SELECT * FROM (SELECT j.id, j.priority, j.available_at FROM {schema}.jobs j
         WHERE {_plain_ready} AND j.priority = 0
         ORDER BY j.available_at, j.id
         LIMIT %(limit)s
         FOR UPDATE SKIP LOCKED) AS usual
        UNION ALL
        SELECT * FROM (SELECT j.id, j.priority, j.available_at FROM {schema}.jobs j
         WHERE {_plain_ready} AND j.priority < 0
         ORDER BY j.priority DESC, j.available_at, j.id
         LIMIT %(limit)s
         FOR UPDATE SKIP LOCKED) AS lower
    ) AS c
    WHERE q.name NOT IN (SELECT p.queue FROM {schema}.paused_queues AS p)
), others AS (
    -- The two lines of one key each, every job's place in its line at its priority.
    SELECT o.id, o.priority,
           row_number() OVER (PARTITION BY o.line, o.priority ORDER BY o.available_at, o.id)
               AS place
    FROM (SELECT 'plain' AS line, p.* FROM plain AS p
          UNION ALL SELECT 'late', l.* FROM late AS l) AS o
), expired AS (
    SELECT j.id, j.priority
    FROM {schema}.jobs j
    WHERE %(expired)s::boolean AND {_lease_expired}
    ORDER BY j.priority DESC, j.available_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), picked AS (
    SELECT id FROM (
        SELECT e.id, e.priority, '-infinity'::float8 AS turn FROM expired AS e
        UNION ALL SELECT f.id, f.priority, f.turn FROM fair AS f
        UNION ALL
        SELECT o.id, o.priority,
               coalesce((SELECT min(f.turn) FROM fair AS f WHERE f.priority = o.priority), 0)
               + o.place - 1
        FROM others AS o
    ) AS m
    ORDER BY priority DESC, turn, id
    LIMIT %(limit)s
)
{_take_picked};
