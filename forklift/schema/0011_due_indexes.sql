-- forklift 0011: the ready jobs of each queue by due time, for the lookups an idle worker
-- and the queue gauges make. {schema} is replaced by the quoted schema name when the
-- migration is applied.
--
-- When is a queue's next job due, and how many are due now or later: with the ready jobs
-- ordered by due time alone (jobs_available_idx), those asked walked every other queue's
-- ready jobs due sooner (50 ms an idle wait at 300,000 jobs of another queue, growing
-- with them). Here each queue's are in a range of their own, split on the limit's key as
-- the claim indexes are (migration 0007): a ready job is in exactly one of the two, so a
-- write costs one index entry more, and the plain claim's lookup never walks past jobs
-- under a limit it does not take.
--
-- Each CREATE INDEX reads the whole table and holds off writes to it while it builds;
-- `forklift migrate` gives a statement 60 s. On a big live table, build both first with
-- CREATE INDEX CONCURRENTLY (same names and definitions), then migrate: IF NOT EXISTS
-- keeps them.

-- Jobs no limit covers, each queue's by due time.
CREATE INDEX IF NOT EXISTS jobs_ready_due_idx
    ON {schema}.jobs (queue, available_at)
    WHERE state = 'ready' AND limit_key IS NULL;

-- Jobs under a task limit, each queue's by due time.
CREATE INDEX IF NOT EXISTS jobs_ready_limited_due_idx
    ON {schema}.jobs (queue, available_at)
    WHERE state = 'ready' AND limit_key IS NOT NULL;
