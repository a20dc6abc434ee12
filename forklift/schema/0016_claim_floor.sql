-- forklift: online
-- forklift 0016: the ready jobs of the default priority apart from the others', for a
-- claim that reads them from a floor (store/queries.sql, job_claim_one). {schema} is
-- replaced by the quoted schema name when the migration is applied.
--
-- A worker's claim reads each queue's default-priority jobs from where its last claim
-- left off, not from the start of the line, whose head is the dead versions of the
-- jobs claimed before (no vacuum removes them while another transaction holds the
-- horizon back). It needs an index in which those jobs are in due order on their own,
-- and one in which the other priorities' are, so that PostgreSQL has no cheaper-looking
-- way to read either than the one in claim order: with only the index of every
-- priority (jobs_ready_unlimited_idx) beside jobs_available_idx, it read the branch of
-- the higher priorities through jobs_available_idx, from its start, and sorted (17 ms a
-- claim under 180,000 dead versions). A ready job of the default priority is in the
-- first (a write costs one index entry more); one of another priority in the second.
--
-- An online migration (its first line): on a jobs table of over 100,000 rows,
-- `forklift migrate` builds each index CONCURRENTLY, outside a transaction, so writes
-- go on while it reads the table (forklift/schema/__init__.py; bench.migration
-- measures it); on a smaller one, in a transaction as any other migration.

-- Jobs of the default priority no limit covers, each queue's in claim order.
CREATE INDEX IF NOT EXISTS jobs_ready_usual_idx
    ON {schema}.jobs (queue, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND priority = 0;

-- Jobs of any other priority no limit covers, each queue's in claim order.
CREATE INDEX IF NOT EXISTS jobs_ready_ranked_idx
    ON {schema}.jobs (queue, priority DESC, available_at, id)
    WHERE state = 'ready' AND limit_key IS NULL AND priority <> 0;
