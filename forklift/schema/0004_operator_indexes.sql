-- forklift 0004: indexes that keep the operator's and the metrics' counts off the finished
-- rows a day of retention piles up (at 2,000 jobs/s, ~170 M of them).
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- Each CREATE INDEX reads the whole table and holds off writes to it while it builds;
-- `forklift migrate` gives a statement 60 s. On a big live table, build both first with
-- CREATE INDEX CONCURRENTLY (same names and definitions), then migrate: IF NOT EXISTS
-- keeps them, and the DROP below is instant.

-- Dead jobs per queue (status, /metrics, top): counted from this index alone, without
-- reading the rows. Only a job that goes dead, or leaves dead, writes it.
CREATE INDEX IF NOT EXISTS jobs_dead_queue_idx ON {schema}.jobs (queue)
    WHERE state = 'dead';

-- Finished jobs by completion time: retention pruning, purges, and what finished in the
-- last minute or hour per queue and state, counted from the index alone (queue and state
-- carried in it). Replaces jobs_finished_idx, same key and predicate: one index to write
-- per completion, as before.
CREATE INDEX IF NOT EXISTS jobs_completed_idx ON {schema}.jobs (completed_at)
    INCLUDE (queue, state)
    WHERE state IN ('succeeded', 'dead', 'cancelled');

DROP INDEX IF EXISTS {schema}.jobs_finished_idx;
