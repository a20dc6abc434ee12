-- forklift 0012: a batch's jobs are kept while its callback may read them.
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
