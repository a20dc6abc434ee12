-- forklift 0009: what the dashboard needs to count a big batch each second.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- A batch's dead and cancelled jobs, counted from this index alone. With its ready and
-- running jobs (their own indexes) and its total, they give every count of the batch's
-- progress bar without reading one row per job that succeeded: a batch of 200,000 is
-- counted in a millisecond, not in a tenth of a second. Only a batch job that goes dead
-- or is cancelled (or is retried from there) writes it; a success never does. In id
-- order, it also gives a batch's first dead jobs (`batches show`, the batch's page)
-- without a walk through every dead job of older batches.
--
-- CREATE INDEX reads the whole table and holds off writes while it builds: on a big live
-- table, build it first with CREATE INDEX CONCURRENTLY (same name and definition), then
-- migrate: IF NOT EXISTS keeps it.
CREATE INDEX IF NOT EXISTS jobs_batch_failed_idx ON {schema}.jobs (batch_id, state, id)
    WHERE batch_id IS NOT NULL AND state IN ('dead', 'cancelled');
