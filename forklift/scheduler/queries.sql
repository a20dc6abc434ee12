-- The scheduler's queries. Each starts with `-- name: <name>` and a one-line
-- description; {schema} is replaced by the quoted schema name when loaded. Fire times
-- and `now` come from the scheduler's clock: the database's (schedule_clock), or a
-- parameter a test moves.

-- name: schedule_clock
-- The database's clock, which every scheduling decision of a round is made on (so a
-- replica whose host clock is wrong fires on time all the same).
SELECT clock_timestamp();

-- name: schedule_sync_many
-- Upsert the definitions this scheduler declares, in name order (no deadlock between
-- replicas). A new schedule, or one whose definition hash changed, starts from `now`:
-- the old definition's misses are not caught up. Returns each one's high-water mark
-- and whether it was (re)defined by this statement.
INSERT INTO {schema}.schedules AS s
    (name, task, queue, cron, every_seconds, tz, catchup_seconds, overlap, definition_hash,
     defined_at, fired_through, next_fire_at, seen_at)
SELECT d.name, d.task, d.queue, d.cron, d.every_seconds, d.tz, d.catchup_seconds, d.overlap,
       d.definition_hash, %(now)s::timestamptz, %(now)s::timestamptz, d.next_fire_at, now()
FROM unnest(
    %(name)s::text[], %(task)s::text[], %(queue)s::text[], %(cron)s::text[],
    %(every_seconds)s::integer[], %(tz)s::text[], %(catchup_seconds)s::float8[],
    %(overlap)s::boolean[], %(definition_hash)s::text[], %(next_fire_at)s::timestamptz[]
) AS d(name, task, queue, cron, every_seconds, tz, catchup_seconds, overlap,
       definition_hash, next_fire_at)
ORDER BY d.name
ON CONFLICT (name) DO UPDATE SET
    task = EXCLUDED.task,
    queue = EXCLUDED.queue,
    cron = EXCLUDED.cron,
    every_seconds = EXCLUDED.every_seconds,
    tz = EXCLUDED.tz,
    catchup_seconds = EXCLUDED.catchup_seconds,
    overlap = EXCLUDED.overlap,
    definition_hash = EXCLUDED.definition_hash,
    defined_at = CASE WHEN s.definition_hash = EXCLUDED.definition_hash
        THEN s.defined_at ELSE EXCLUDED.defined_at END,
    fired_through = CASE WHEN s.definition_hash = EXCLUDED.definition_hash
        THEN s.fired_through ELSE EXCLUDED.fired_through END,
    next_fire_at = EXCLUDED.next_fire_at,
    seen_at = now()
RETURNING s.name, s.fired_through, s.defined_at = %(now)s::timestamptz AS redefined;

-- name: schedule_fire_lock
-- Take one schedule's firing lock for this transaction; false if another replica is
-- firing it now. An advisory lock, not the row's: the rounds' other writes to the row
-- (sync, settle) hold it for a moment and must not make a replica think it is taken.
SELECT pg_try_advisory_xact_lock(
    ('x' || left(md5('forklift:schedule-fire:{schema}:' || %(name)s::text), 16))::bit(64)::bigint);

-- name: schedule_lock
-- The schedule a round fires, read after its firing lock (schedule_fire_lock) in a fresh
-- snapshot: what the last firer advanced is seen. With the transaction's start (`now()`,
-- the created_at of the jobs it enqueues): what the round plans from, so a fire planned
-- ahead is enqueued ahead of its time.
SELECT fired_through, definition_hash, now() AS now FROM {schema}.schedules
WHERE name = %(name)s::text;

-- name: schedule_fire
-- Enqueue the job of one fire time and note the fire in flight. Nothing if the fire is
-- already in flight, or its key is held by a job of this schedule's task, queue and
-- arguments (another replica enqueued it). A key held by any other job (a row written
-- by hand: producers cannot enqueue `forklift:` keys) does not stop the fire: its job
-- goes in without a key. With `exclusive` (overlap=False), nothing while an earlier
-- fire's job is unfinished (ready or running); nothing if its task is unique
-- (forklift.Unique) and a live job holds the fire's unique key. Returns (busy, the new
-- job's id or NULL, whether the key was held by a job not of this schedule).
WITH new AS (
    SELECT * FROM (VALUES ({_job_values}, {_unique_values}))
        AS j({_job_columns}, idempotency_key, run_at, delay, {_unique_fields})
), busy AS (
    SELECT 1 FROM {schema}.schedule_fires f JOIN {schema}.jobs j ON j.id = f.job_id
    WHERE %(exclusive)s::boolean AND f.schedule = %(name)s::text
      AND f.fire_at < %(fire_at)s::timestamptz AND j.state IN ('ready', 'running')
    LIMIT 1
), holder AS (
    SELECT h.task = n.task AND h.queue = n.queue AND h.args = n.args AS ours
    FROM {schema}.jobs h, new n WHERE h.idempotency_key = %(key)s::text
), job AS (
    INSERT INTO {schema}.jobs ({_job_columns}, idempotency_key, available_at, unique_key,
        unique_states)
    SELECT {_job_columns},
           CASE WHEN EXISTS (SELECT 1 FROM holder) THEN NULL ELSE j.idempotency_key END,
           {_job_due}, {_unique_key}, j.unique_states
    FROM new AS j
    WHERE NOT EXISTS (SELECT 1 FROM busy)
      AND NOT EXISTS (SELECT 1 FROM holder WHERE ours)
      AND NOT EXISTS (SELECT 1 FROM {schema}.schedule_fires f
                      WHERE f.schedule = %(name)s::text AND f.fire_at = %(fire_at)s::timestamptz)
    ON CONFLICT DO NOTHING  -- its idempotency key taken, or its unique key held
    RETURNING id
), fire AS (
    INSERT INTO {schema}.schedule_fires (schedule, fire_at, job_id)
    SELECT %(name)s::text, %(fire_at)s::timestamptz, id FROM job
    ON CONFLICT DO NOTHING
    RETURNING job_id
)
SELECT EXISTS (SELECT 1 FROM busy) AS busy, (SELECT id FROM job) AS job_id,
       coalesce((SELECT NOT ours FROM holder), false) AS key_taken;

-- name: schedule_advance
-- Move a schedule's high-water mark forward, unless its definition changed meanwhile.
UPDATE {schema}.schedules
SET fired_through = greatest(fired_through, %(through)s::timestamptz)
WHERE name = %(name)s::text AND definition_hash = %(definition_hash)s::text;

-- name: schedule_settle
-- For every schedule: move its last fire up to its latest fire now due, record how its
-- finished jobs went (succeeded: last success; dead: last error), and forget the fires
-- whose job is done (or gone). Returns (fires settled, schedules updated).
WITH fires AS (
    SELECT f.schedule, f.fire_at, f.job_id, j.state, j.completed_at, j.last_error
    FROM {schema}.schedule_fires f LEFT JOIN {schema}.jobs j ON j.id = f.job_id
    WHERE f.fire_at <= %(now)s::timestamptz
    FOR UPDATE OF f SKIP LOCKED
), done AS (
    DELETE FROM {schema}.schedule_fires f USING fires
    WHERE f.schedule = fires.schedule AND f.fire_at = fires.fire_at
      AND (fires.state IS NULL OR fires.state IN ('succeeded', 'dead', 'cancelled'))
    RETURNING f.schedule
), summary AS (
    SELECT schedule,
           max(fire_at) AS last_fire_at,
           (array_agg(job_id ORDER BY fire_at DESC))[1] AS last_job_id,
           max(completed_at) FILTER (WHERE state = 'succeeded') AS last_success_at,
           (array_agg(last_error ORDER BY completed_at DESC)
               FILTER (WHERE state = 'dead'))[1] AS last_error,
           max(completed_at) FILTER (WHERE state = 'dead') AS last_error_at
    FROM fires
    GROUP BY schedule
), updated AS (
    UPDATE {schema}.schedules AS s SET
        last_fire_at = greatest(s.last_fire_at, u.last_fire_at),
        last_job_id = CASE WHEN u.last_fire_at >= coalesce(s.last_fire_at, '-infinity')
            THEN u.last_job_id ELSE s.last_job_id END,
        last_success_at = greatest(s.last_success_at, u.last_success_at),
        last_error = CASE WHEN u.last_error_at > coalesce(s.last_error_at, '-infinity')
            THEN u.last_error ELSE s.last_error END,
        last_error_at = greatest(s.last_error_at, u.last_error_at)
    FROM summary AS u
    WHERE s.name = u.schedule
      AND (u.last_fire_at > coalesce(s.last_fire_at, '-infinity')
           OR u.last_success_at > coalesce(s.last_success_at, '-infinity')
           OR u.last_error_at > coalesce(s.last_error_at, '-infinity'))
    RETURNING s.name
)
SELECT (SELECT count(*) FROM done) AS settled, (SELECT count(*) FROM updated) AS updated;

-- name: schedule_list
-- Every schedule any scheduler has declared, with its fires in flight and how long ago
-- a scheduler declaring it last synced it (seconds).
SELECT s.name, s.task, s.queue, s.cron, s.every_seconds, s.tz, s.catchup_seconds,
       s.overlap, s.definition_hash, s.created_at, s.defined_at, s.next_fire_at,
       s.last_fire_at, s.last_job_id, s.last_success_at, s.last_error, s.last_error_at,
       (SELECT count(*) FROM {schema}.schedule_fires f WHERE f.schedule = s.name)::integer
           AS in_flight,
       extract(epoch FROM now() - s.seen_at)::float8 AS seen_ago
FROM {schema}.schedules AS s
ORDER BY s.name;
