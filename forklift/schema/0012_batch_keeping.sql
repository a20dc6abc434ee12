-- forklift 0012: a batch's jobs are kept while its callback may read them, and a batch
-- its producer left unsealed is finished as abandoned.
-- {schema} is replaced by the quoted schema name when the migration is applied.

-- Whether batch `id` still needs its row and its jobs: it has not finished, or its
-- callback has not (a callback waiting for a retry reads every result again). The one
-- rule of every delete of finished jobs and batches: retention (job_prune, batch_prune)
-- and `forklift jobs purge`. A batch whose row is gone holds nothing.
CREATE FUNCTION {schema}.batch_holds(id bigint) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM {schema}.batches AS b
        WHERE b.id = batch_holds.id
          AND (b.finished_at IS NULL
               OR EXISTS (SELECT 1 FROM {schema}.jobs AS c
                          WHERE c.id = b.callback_job_id AND c.state IN ('ready', 'running'))))
$$;

ALTER TABLE {schema}.batches
    -- The last time its producer added jobs (or made it): a batch left unsealed this
    -- long after it is abandoned (its producer died inside its `with app.batch()`).
    ADD COLUMN added_at timestamptz NOT NULL DEFAULT now(),
    -- When maintenance sealed it as abandoned; it finishes with the outcome 'abandoned'.
    ADD COLUMN abandoned_at timestamptz,
    DROP CONSTRAINT batches_outcome,
    ADD CONSTRAINT batches_outcome
        CHECK (outcome IS NULL OR outcome IN ('succeeded', 'failed', 'cancelled', 'abandoned'));

-- Batches still filling, by their last enqueue: maintenance's look for abandoned ones.
CREATE INDEX batches_filling_idx ON {schema}.batches (added_at) WHERE sealed_at IS NULL;
