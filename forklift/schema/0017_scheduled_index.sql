-- forklift: online
-- forklift 0017: the index of all ready jobs by due time gives way to one of the jobs
-- whose due time was put off (delayed, scheduled, retried later), which the operator's
-- list of scheduled jobs reads (admin/jobs.sql, job_list). {schema} is replaced by the
-- quoted schema name when the migration is applied.
--
-- The claim's every branch could be read through jobs_available_idx, whose predicate
-- (state = 'ready') each branch's conditions imply. The ready line is empty at steady
-- state, so the last VACUUM ANALYZE recorded no entries in any index of ready jobs, and
-- while another transaction holds the horizon back, a VACUUM removes nothing and leaves
-- that count as it was: every such index then looks alike to the planner, and the one
-- on due time alone won on its column's correlation. Through it the claim's higher- and
-- lower-priority branches read from its start, through the dead version of every job
-- claimed since the horizon was taken (220 ms a claim 8 minutes into a hold at 1,000
-- jobs/s), where their own index (jobs_ready_ranked_idx, migration 0016) is empty.
-- tests/integration/test_claim_floor.py holds the claim to its own indexes.
--
-- A job due at once is due when it was created (both now() of its insert), so it never
-- enters the new index, nor do the dead versions it leaves when claimed; a claim, which
-- says nothing of created_at, cannot read it. A job due later than now() was created
-- before now(): the list of scheduled jobs, which says both, reads every one of them.
--
-- An online migration (its first line): on a jobs table of over 100,000 rows,
-- `forklift migrate` builds the index CONCURRENTLY and drops the old one the same way.

-- Ready jobs due later than they were created, by due time.
CREATE INDEX IF NOT EXISTS jobs_scheduled_idx
    ON {schema}.jobs (available_at)
    WHERE state = 'ready' AND available_at > created_at;

DROP INDEX IF EXISTS {schema}.jobs_available_idx;
