-- forklift 0025: worker labels. A task declared `requires={"gpu"}` has its jobs stored
-- with the labels a worker must have to run them (`jobs.requires`: sorted, joined by
-- commas; NULL for a job any worker may run), and a worker started with `--labels`
-- says which it has (`processes.labels`). Claims of plain workers leave such jobs alone
-- (store/fragments.sql, `_claimable`); a worker with labels claims those its labels
-- cover first (store/queries.sql, job_claim_labelled). `forklift status` counts the
-- ready ones no live worker can take. {schema} is replaced by the quoted schema name
-- when the migration is applied.

ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS requires text;

ALTER TABLE {schema}.processes ADD COLUMN IF NOT EXISTS labels text[] NOT NULL DEFAULT '{}';
