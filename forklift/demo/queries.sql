-- forklift demo: the effects table of the Mandelbrot app and what the demo reads back.
-- {schema} is the demo's own schema (forklift_demo_<hex>), dropped when it ends.

-- name: tiles_create
-- One row per committed tile effect. No unique constraint on purpose: a tile whose
-- effect committed twice would show as two rows, and the demo counts them.
CREATE TABLE {schema}.demo_tiles (
    tile        integer NOT NULL,
    worker_pid  integer NOT NULL,
    attempt     integer NOT NULL,
    pixels      bytea NOT NULL,
    rendered_at timestamptz NOT NULL DEFAULT now()
);

-- name: images_create
-- One row per committed run of the batch's callback (assemble), written in its job's
-- completion transaction. No unique constraint either: a callback that committed twice
-- would show as two rows.
CREATE TABLE {schema}.demo_images (
    batch_id     bigint NOT NULL,
    worker_pid   integer NOT NULL,
    attempt      integer NOT NULL,
    path         text NOT NULL,
    assembled_at timestamptz NOT NULL DEFAULT now()
);

-- name: image_insert
-- The callback's effect: it assembled the batch's image, in its completion transaction.
INSERT INTO {schema}.demo_images (batch_id, worker_pid, attempt, path)
VALUES (%(batch)s::bigint, %(worker_pid)s::integer, %(attempt)s::integer, %(path)s::text);

-- name: image_count
-- The callback-once check: committed runs of the batch's callback.
SELECT count(*)::integer FROM {schema}.demo_images WHERE batch_id = %(batch)s::bigint;

-- name: tile_insert
-- A rendered tile: the handler's effect, in its job's completion transaction.
INSERT INTO {schema}.demo_tiles (tile, worker_pid, attempt, pixels)
VALUES (%(tile)s::integer, %(worker_pid)s::integer, %(attempt)s::integer, %(pixels)s::bytea);

-- name: tile_all
-- Every tile effect, for the image.
SELECT tile, worker_pid, attempt, pixels FROM {schema}.demo_tiles ORDER BY tile, rendered_at;

-- name: tile_count_by_worker
-- How many tiles each worker process rendered.
SELECT worker_pid, count(*)::integer FROM {schema}.demo_tiles GROUP BY worker_pid;

-- name: tile_rerendered
-- Tiles committed by a later attempt than the first: who rendered them in the end.
SELECT tile, worker_pid, attempt FROM {schema}.demo_tiles WHERE attempt > 1 ORDER BY tile;

-- name: tile_effect_counts
-- The exactly-once check: effect rows, distinct tiles among them.
SELECT count(*)::integer, count(DISTINCT tile)::integer FROM {schema}.demo_tiles;

-- name: tile_retried
-- The failed attempts at the batch's tiles: tile, the failed attempt's lease owner
-- (host:pid:nonce), its error, and the worker whose effect committed (NULL: none did).
SELECT (j.args->>'tile')::integer, coalesce(e->>'worker', ''), coalesce(e->>'error', ''),
       t.worker_pid
FROM {schema}.jobs AS j
CROSS JOIN LATERAL jsonb_array_elements(j.errors) AS e
LEFT JOIN {schema}.demo_tiles AS t ON t.tile = (j.args->>'tile')::integer
WHERE j.batch_id = %(batch)s::bigint
ORDER BY j.id, (e->>'attempt')::integer;

-- name: job_count_by_state
-- The batch's jobs (the tiles) per state.
SELECT state::text, count(*)::integer FROM {schema}.jobs
WHERE batch_id = %(batch)s::bigint
GROUP BY state;

-- name: job_running
-- The batch's running jobs, the most recently started first: id, tile, lease owner
-- (host:pid:nonce).
SELECT id, (args->>'tile')::integer, lease_owner FROM {schema}.jobs
WHERE batch_id = %(batch)s::bigint AND state = 'running'
ORDER BY started_at DESC;

-- name: job_held_quietly
-- True while the job is still running under this owner (not completed meanwhile) and
-- none of the owner's sessions (named %(session)s) is running a statement.
SELECT EXISTS (
    SELECT 1 FROM {schema}.jobs
    WHERE id = %(id)s::bigint AND state = 'running' AND lease_owner = %(owner)s::text
) AND NOT EXISTS (
    SELECT 1 FROM pg_stat_activity
    WHERE application_name = %(session)s::text AND state IS DISTINCT FROM 'idle'
      AND state IS DISTINCT FROM 'idle in transaction'
);

-- name: job_charged
-- The batch's jobs with at least one failed attempt: tile, attempts, state, the latest
-- error.
SELECT (args->>'tile')::integer, attempts, state::text, coalesce(last_error, '')
FROM {schema}.jobs
WHERE batch_id = %(batch)s::bigint AND jsonb_array_length(errors) > 0
ORDER BY id;

-- name: schema_drop
-- The demo's schema and everything in it (jobs, batches, processes, tiles, images).
DROP SCHEMA IF EXISTS {schema} CASCADE;
