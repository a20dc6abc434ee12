-- forklift: online
-- forklift 0024: the indexes of fair shares (migration 0023). {schema} is replaced by the
-- quoted schema name when the migration is applied.
--
-- Fair jobs are claimed in turn order through an index of their own (those due later
-- than their enqueue, in due order, through another), and each key's next turn is found
-- through a third. The plain claim's two indexes (migration 0016)
-- are built again without fair jobs (same columns, `fair_key IS NULL` added), so that a
-- queue's plain jobs are read without walking past a fair backlog, by job_claim_one and
-- by job_claim_fair alike; job_claim and the claims under limits read every unlimited
-- job (jobs_ready_unlimited_idx), fair ones in due order, so no job waits on which claim
-- a worker makes.
--
-- An online migration (its first line): on a jobs table of over 100,000 rows,
-- `forklift migrate` builds each index CONCURRENTLY, outside a transaction, so writes
-- go on while it reads the table (forklift/schema/__init__.py); the new indexes are
-- built before the old ones are dropped.

-- Fair jobs holding turns (due now) no limit covers, each queue's in claim order
-- (priority, then turn).
CREATE INDEX IF NOT EXISTS jobs_ready_fair_idx
    ON {schema}.jobs (queue, priority DESC, fair_turn, id)
    WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NOT NULL
      AND fair_turn IS NOT NULL;

-- Each key's waiting jobs in turn order: where its next job's turn follows on.
CREATE INDEX IF NOT EXISTS jobs_ready_fair_key_idx
    ON {schema}.jobs (queue, fair_key, fair_turn)
    WHERE state = 'ready' AND fair_key IS NOT NULL AND fair_turn IS NOT NULL;

-- Fair jobs without a turn (due later when they were enqueued or given back), each
-- queue's in due order: claimed once due, as jobs that arrive then.
CREATE INDEX IF NOT EXISTS jobs_ready_fair_late_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NOT NULL
      AND fair_turn IS NULL;

-- Jobs of the default priority that neither a limit covers nor fair shares order, each
-- queue's in claim order (jobs_ready_usual_idx, without fair jobs).
CREATE INDEX IF NOT EXISTS jobs_ready_plain_idx
    ON {schema}.jobs (queue, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND priority = 0;

-- The same of any other priority (jobs_ready_ranked_idx, without fair jobs).
CREATE INDEX IF NOT EXISTS jobs_ready_plain_ranked_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND fair_key IS NULL AND priority <> 0;

DROP INDEX IF EXISTS {schema}.jobs_ready_usual_idx;

DROP INDEX IF EXISTS {schema}.jobs_ready_ranked_idx;
