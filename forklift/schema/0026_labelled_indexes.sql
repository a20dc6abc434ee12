-- forklift: online
-- forklift 0026: the indexes of worker labels (migration 0025). {schema} is replaced by
-- the quoted schema name when the migration is applied.
--
-- Jobs that require labels are claimed through an index of their own, by workers with
-- labels; the plain claim's two indexes (migration 0024) are built again without them
-- (same columns, `requires IS NULL` added, new names), so that a worker without labels
-- reads a queue's plain jobs without walking past a backlog only a GPU host can take.
--
-- An online migration (its first line): on a jobs table of over 100,000 rows,
-- `forklift migrate` builds each index CONCURRENTLY, outside a transaction, so writes
-- go on while it reads the table (forklift/schema/__init__.py); the new indexes are
-- built before the old ones are dropped.

-- Jobs that require labels (no limit or fair key: refused with them), each queue's in
-- claim order.
CREATE INDEX IF NOT EXISTS jobs_ready_labelled_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
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

DROP INDEX IF EXISTS {schema}.jobs_ready_plain_idx;

DROP INDEX IF EXISTS {schema}.jobs_ready_plain_ranked_idx;
