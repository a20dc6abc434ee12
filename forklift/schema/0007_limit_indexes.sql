-- forklift 0007: a job under a task limit waits in claim indexes of its own.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- jobs.limit_key is set (the key's value, or '' for a limit with no key) on every job of
-- a task with a limit, as its producer or a limited claim found it. The ready jobs are
-- split on it into two claim indexes that share no row, so a job is written to as many
-- indexes as before, and:
-- - a claim never walks past held-back jobs of a full key to reach jobs no limit covers
--   (those are in their own index);
-- - a claim under limits walks the limited jobs in line order for a bounded length, and
--   past that takes the first jobs of each key with room (jobs_ready_key_idx, one probe
--   per key), so a key with 10,000 held-back jobs costs a claim no more than one with 10.
--
-- Each CREATE INDEX reads the whole table and holds off writes to it while it builds;
-- `forklift migrate` gives a statement 60 s. On a big live table, build the three first
-- with CREATE INDEX CONCURRENTLY (same names and definitions), then migrate: IF NOT
-- EXISTS keeps them, and the DROP below is instant.

-- The claim of jobs no limit covers (the plain claim's whole scan), in claim order.
CREATE INDEX IF NOT EXISTS jobs_ready_unlimited_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL;

-- Jobs under a task limit, in claim order: the limited claim's walk.
CREATE INDEX IF NOT EXISTS jobs_ready_limited_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NOT NULL;

-- The same jobs by key, each key's in claim order: the keys with ready jobs (a loose
-- index scan) and the first jobs of each.
CREATE INDEX IF NOT EXISTS jobs_ready_key_idx
    ON {schema}.jobs (queue, task, limit_key, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NOT NULL;

DROP INDEX IF EXISTS {schema}.jobs_ready_idx;

-- A limited job stopped running: wake its queue's workers, one of them may start the
-- next. Not when a claim completes it in its own transaction (`forklift.claiming`): that
-- claim takes what the slot frees itself, and wakes the queue only if it left some.
CREATE OR REPLACE FUNCTION {schema}.jobs_notify_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('forklift.claiming', true) IS DISTINCT FROM 'on' THEN
        PERFORM pg_notify(TG_TABLE_SCHEMA || '_jobs', OLD.queue);
    END IF;
    RETURN NULL;
END
$$;
