-- forklift 0014: a finished job keeps the worker that ran its last attempt.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- lease_owner is the running job's owner and is cleared when the job finishes (the
-- jobs_lease_when_running check and the expiry index rely on that), so a succeeded job
-- said nothing of who ran it: `jobs show` and the dashboard read `worker -`. The
-- completion copies the owner here; a failed attempt's worker is in its error history.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS ran_by text;
