-- forklift: online
-- forklift 0026: the indexes of worker labels (migration 0025). {schema} is replaced by
-- the quoted schema name when the migration is applied.
--
-- Jobs that require labels are claimed through an index of their own, by workers with
-- labels, each queue's by the labels they require: a worker probes the sets of labels
-- it has, never reading the jobs that require labels it lacks. The indexes the other
-- claims read are built again without them (same columns, `requires IS NULL` added,
-- new names), so that a worker without labels reads a queue's jobs without walking past
-- a backlog only a GPU host can take: the plain claim's two (migration 0024), and the
-- one of every job no limit covers (migration 0007), which the claim of several queues,
-- the expiry scan's claim and the claims under limits read.
--
-- An online migration (its first line): on a jobs table of over 100,000 rows,
-- `forklift migrate` builds each index CONCURRENTLY, outside a transaction, so writes
-- go on while it reads the table (forklift/schema/__init__.py); the new indexes are
-- built before the old ones are dropped.

-- Jobs that require labels (no limit or fair key: refused with them), each queue's by
-- the labels they require, in claim order.
CREATE INDEX IF NOT EXISTS jobs_ready_labelled_idx
    ON {schema}.jobs (queue, requires, priority DESC, available_at, id)
    WHERE state = 'ready' AND requires IS NOT NULL;

-- Jobs of the default priority that any worker may take and that neither a limit covers
-- nor fair shares order, each queue's in claim order (jobs_ready_plain_idx, without
-- jobs that require labels).
CREATE INDEX IF NOT EXISTS jobs_ready_open_idx
    ON {schema}.jobs (queue, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND requires IS NULL
      AND priority = 0;

-- The same of any other priority (jobs_ready_plain_ranked_idx, without them).
CREATE INDEX IF NOT EXISTS jobs_ready_open_ranked_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND requires IS NULL
      AND priority <> 0;

-- Jobs no limit covers that any worker may take, fair ones too, in claim order
-- (jobs_ready_unlimited_idx, without jobs that require labels).
CREATE INDEX IF NOT EXISTS jobs_ready_unlabelled_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND requires IS NULL;

DROP INDEX IF EXISTS {schema}.jobs_ready_plain_idx;

DROP INDEX IF EXISTS {schema}.jobs_ready_plain_ranked_idx;

DROP INDEX IF EXISTS {schema}.jobs_ready_unlimited_idx;
