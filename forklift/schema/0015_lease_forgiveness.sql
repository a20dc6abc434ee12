-- forklift 0015: a lost lease charges the job only if its handler was seen running.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- A worker holds more jobs than it runs: jobs claimed ahead wait for a slot. When its
-- lease is lost with the worker (its host cut off or gone), a job whose handler never
-- started did nothing wrong, yet lease expiry (and a peer that finds the host's liveness
-- lock free) charged it an attempt, as if it had. The worker's lease renewal now says
-- which of its jobs' handlers it called (`seen_running`, cleared by every claim), and a
-- lost attempt not seen running is forgiven: the job gets that attempt back as one more
-- (max_attempts grows by one, so the attempt number, which fences every write, still
-- moves on), at most 3 times per job (`leases_forgiven`): a job that takes its host down
-- before its first renewal is charged from the fourth time on.
-- Both columns have constant defaults: added without rewriting the table.
ALTER TABLE {schema}.jobs
    ADD COLUMN IF NOT EXISTS seen_running boolean NOT NULL DEFAULT false,
    ADD COLUMN IF NOT EXISTS leases_forgiven smallint NOT NULL DEFAULT 0;
