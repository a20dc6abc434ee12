-- forklift 0013: a cancelled job's handler keeps its limit slot until it has stopped.
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- An operator's cancel ends a running job at once (its lease is taken: the owner fence
-- refuses whatever its worker records next), but its handler may run on for up to
-- --cancel-grace before its supervisor kills the worker. Until then the job still takes
-- its limits' slots (DESIGN invariant 20): the cancel moves its lease here, to
-- `stopping_owner` and `stopping_until`, which the limit counts read beside the running
-- jobs. Its worker renews the hold while the handler runs and clears it once the handler
-- has stopped; a dead worker's supervisor clears the holds of its cancelled jobs; the hold
-- lapses unrenewed otherwise (its host is gone). Columns of their own, not the lease's:
-- a lease owner means the job runs (jobs_lease_when_running), which every fenced write
-- relies on.
ALTER TABLE {schema}.jobs
    ADD COLUMN stopping_owner text,
    ADD COLUMN stopping_until timestamptz;

-- The held cancelled jobs, for the limit counts and for a worker's or supervisor's
-- release of them: few rows (a hold lasts until the handler stops), whatever the table holds.
CREATE INDEX jobs_stopping_idx ON {schema}.jobs (stopping_owner)
    WHERE stopping_owner IS NOT NULL;
