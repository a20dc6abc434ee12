-- forklift 0018: checkpoints, so that a resumable job's next attempt starts where the
-- last one left off (ctx.checkpoint, ctx.iterate, ctx.step; workers/checkpoints.py).
-- {schema} is replaced by the quoted schema name when the migration is applied.
--
-- One document per job, written whole by the worker that holds its lease (fenced by owner
-- and attempt, as a completion is): {"v": version, "state": the handler's own state,
-- "cursors": {loop name: cursor}, "steps": {step name: result}, "ran": seconds of work
-- it stands for}. A write carries a version and lands only over an older one, so a write
-- sent before a newer one (the worker's periodic writer, racing the handler's own
-- commit) never undoes it. Kept by a retry, a release and a death (`jobs retry` resumes
-- it); cleared by success and cancel, and by `forklift jobs retry --from-scratch`.
-- NULL, as nearly every job's is, it costs the row nothing.
ALTER TABLE {schema}.jobs
    ADD COLUMN IF NOT EXISTS checkpoint jsonb,
    ADD COLUMN IF NOT EXISTS checkpoint_at timestamptz;
