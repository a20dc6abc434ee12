-- forklift 0006: concurrency and rate limits, held in the claim; queue backpressure.
-- {schema} is replaced by the quoted schema name when the migration is applied.

ALTER TABLE {schema}.jobs
    -- The value of its task's limit key (Limit(key=...)), computed at enqueue; NULL:
    -- none. A producer that does not know the task stores none: such jobs of a keyed
    -- task share one key ('').
    ADD COLUMN limit_key text,
    -- Claimed under a limit: when it stops running, its queue's workers are woken (a
    -- slot freed; jobs_notify_freed below).
    ADD COLUMN limited boolean NOT NULL DEFAULT false;

-- One row per limited task (declared in code, written by the workers that run it) and
-- per queue with run-time limits (`forklift queues limit`). A claim of jobs under a
-- limit locks its row first (limit_lock), then counts in a fresh snapshot: exact
-- across every replica, with no counter to keep and nothing to leak.
CREATE TABLE {schema}.limits (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope        text NOT NULL,
    name         text NOT NULL,
    concurrency  integer,            -- running at once, per key
    rate         integer,            -- starts in any window of `per` seconds, per key
    per          double precision,
    keyed        boolean NOT NULL DEFAULT false,   -- per value of the job's key
    key_arg      text,               -- the argument that is the key (when not a callable; shown)
    max_depth    integer,            -- queues: ready and scheduled jobs at most
    rejected     bigint NOT NULL DEFAULT 0,        -- enqueues refused by max_depth
    updated_at   timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT limits_scope CHECK (scope IN ('task', 'queue')),
    CONSTRAINT limits_positive CHECK (
        (concurrency IS NULL OR concurrency > 0) AND (rate IS NULL OR rate > 0)
        AND (per IS NULL OR per > 0) AND (max_depth IS NULL OR max_depth > 0)),
    CONSTRAINT limits_rate_per CHECK ((rate IS NULL) = (per IS NULL)),
    CONSTRAINT limits_one UNIQUE (scope, name)
);

-- A rate limit's recent starts, per key: `counts[i]` starts in bucket `newest - i + 1`,
-- a bucket being a hundredth of `per`. A claim admits while the 101 newest buckets
-- (which cover any window of `per` seconds ending now) hold fewer than `rate`.
CREATE TABLE {schema}.limit_windows (
    limit_id  bigint NOT NULL REFERENCES {schema}.limits (id) ON DELETE CASCADE,
    key       text NOT NULL,
    newest    bigint NOT NULL,
    counts    integer[] NOT NULL,
    PRIMARY KEY (limit_id, key)
);

-- Starts in the 101 buckets ending at bucket `at` (or at `newest`, if that is later).
CREATE FUNCTION {schema}.limit_window_used(newest bigint, counts integer[], at bigint)
RETURNS integer LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(sum(u.c), 0)::integer
    FROM unnest(counts) WITH ORDINALITY AS u(c, i)
    WHERE newest - (u.i - 1) > greatest(at, newest) - 101
$$;

-- The window moved on to bucket `at` (never back) with `n` more starts in its newest.
CREATE FUNCTION {schema}.limit_window_add(newest bigint, counts integer[], at bigint, n integer)
RETURNS integer[] LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT array_agg(coalesce(u.c, 0) + CASE WHEN k = 0 THEN n ELSE 0 END ORDER BY k)
    FROM generate_series(0, 100) AS k
    LEFT JOIN unnest(counts) WITH ORDINALITY AS u(c, i)
        ON newest - (u.i - 1) = greatest(at, coalesce(newest, at)) - k
$$;

-- When (epoch seconds) the oldest start still in the window leaves it.
CREATE FUNCTION {schema}.limit_window_frees(newest bigint, counts integer[], width float8)
RETURNS float8 LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT (newest - (max(u.i) - 1) + 101) * width
    FROM unnest(counts) WITH ORDINALITY AS u(c, i)
    WHERE u.c > 0
$$;

-- A job claimed under a limit stopped running (any way: completed, failed, released,
-- charged, cancelled): wake its queue's workers, one of them may start the next.
CREATE FUNCTION {schema}.jobs_notify_freed() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_SCHEMA || '_jobs', OLD.queue);
    RETURN NULL;
END
$$;

CREATE TRIGGER jobs_notify_freed AFTER UPDATE OF state ON {schema}.jobs
    FOR EACH ROW WHEN (OLD.limited AND OLD.state = 'running' AND NEW.state <> 'running')
    EXECUTE FUNCTION {schema}.jobs_notify_freed();
